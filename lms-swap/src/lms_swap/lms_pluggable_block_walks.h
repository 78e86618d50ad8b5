#pragma once
// The pluggable LMS allocator's expandable segments: the walks over their
// blocks (lms_pluggable_block_walks.cpp), with no driver call, so that
// ExpandableSegments (lms_pluggable_expandable.h) maps and unmaps pages where
// these say.
//
// An expandable segment's blocks are allocated, free (mapped, listed in
// FreeBlocks once no stream uses them), or unmapped (whole pages with
// nothing mapped, never listed). A request no free block holds grows into a
// run of free and unmapped blocks; releasing memory turns the whole pages of
// a free block into an unmapped block.
#include "lms_pluggable_segments.h"

#include <cstddef>

namespace lms_pluggable {

// Where expandable segment `s` can serve `size` bytes: the first block of a
// run of neighbouring blocks, each free with no events pending or unmapped,
// that holds `size` bytes from its start, and what serving it there maps
// (`map_bytes`, whole pages). Of all such runs the one that maps least, the
// lowest on a tie. `start` nullptr: no run holds it.
struct Growth {
  Block* start = nullptr;
  size_t map_bytes = 0;
};
Growth plan_growth(const Segment& s, size_t size);

// Keeps the first `keep` bytes (whole pages, fewer than it has) in unmapped
// block b; the rest becomes an unmapped block after it.
void split_unmapped(Block* b, size_t keep);

// Merges the neighbouring blocks first..last (mapped, free, none listed)
// into first, and returns it.
Block* merge_run(Block* first, Block* last);

// The whole pages of segment s inside block b: [first, first + count).
struct PageSpan {
  size_t first = 0;
  size_t count = 0;
};
PageSpan whole_pages(const Segment& s, const Block& b);

// Makes the pages `span` of free block b (unlisted, whole pages inside it)
// an unmapped block, merged with unmapped neighbours. b's bytes before them
// stay in b and those after become a new block: both free and mapped,
// returned (nullptr where there are none) for the caller to list.
struct Rest {
  Block* head = nullptr;
  Block* tail = nullptr;
};
Rest carve_unmapped(Block* b, PageSpan span);

} // namespace lms_pluggable
