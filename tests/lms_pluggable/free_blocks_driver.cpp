// Drives lms_pluggable::FreeBlocks (the pluggable LMS allocator's free lists)
// and the walks over expandable segments' blocks (lms_pluggable_block_walks.h)
// on hand-made blocks, with no GPU: each check prints "ok <name>" or
// "FAIL <name>: <why>" (tests/test_lms_pluggable_allocator.py reads them).
#include "lms_pluggable_block_walks.h"
#include "lms_pluggable_free_blocks.h"

#include <cstdio>
#include <string>

using namespace lms_pluggable;

namespace {

int failures = 0;

void check(const char* name, bool ok, const std::string& why = "") {
  std::printf("%s %s%s%s\n", ok ? "ok" : "FAIL", name, ok ? "" : ": ", ok ? "" : why.c_str());
  failures += ok ? 0 : 1;
}

// A segment of `size` bytes at a fake address, covered by one block.
Block* segment(Segment& seg, uintptr_t base, size_t size, bool small, cudaStream_t s) {
  seg.base = base;
  seg.size = size;
  seg.page = size;
  seg.small = small;
  auto* b = new Block();
  b->ptr = reinterpret_cast<char*>(base);
  b->size = size;
  b->stream = s;
  b->seg = &seg;
  seg.first = b;
  return b;
}

// blocks of the segment, in address order, as "size[a|f|u|p]" ... (KiB;
// allocated, free, unmapped, free but waiting for events)
std::string layout(const Segment& seg) {
  std::string out;
  for (const Block* b = seg.first; b; b = b->next) {
    out += std::to_string(b->size >> 10) +
        (b->allocated ? "a " : !b->mapped ? "u " : b->events ? "p " : "f ");
  }
  return out;
}

// An expandable segment of 2 MiB pages at a fake address, its blocks as
// `spec` says ("4a 2f 2a 1f 23u", MiB), the free ones listed in fb.
Block* expandable(Segment& seg, FreeBlocks& fb, const std::string& spec, cudaStream_t s) {
  const size_t MiB = size_t(1) << 20;
  seg.base = 0x100000000ULL;
  seg.page = 2 * MiB;
  seg.expandable = true;
  Block* prev = nullptr;
  size_t at = 0;
  for (size_t i = 0; i < spec.size();) {
    size_t j = spec.find(' ', i);
    j = j == std::string::npos ? spec.size() : j;
    const std::string item = spec.substr(i, j - i);
    auto* b = new Block();
    b->size = std::stoul(item) * MiB;
    b->ptr = reinterpret_cast<char*>(seg.base + at);
    b->stream = s;
    b->seg = &seg;
    const char kind = item.back();
    b->allocated = kind == 'a';
    b->mapped = kind != 'u';
    b->events = kind == 'p' ? 1 : 0;
    b->prev = prev;
    (prev ? prev->next : seg.first) = b;
    prev = b;
    at += b->size;
    i = j + 1;
  }
  seg.size = at;
  for (Block* b = seg.first; b; b = b->next) {
    if (!b->allocated && b->mapped && !b->events) {
      fb.add(b);
    }
  }
  return seg.first;
}

} // namespace

int main() {
  const size_t MiB = size_t(1) << 20;
  auto* s1 = reinterpret_cast<cudaStream_t>(0x1000);
  auto* s2 = reinterpret_cast<cudaStream_t>(0x2000);

  {  // a large segment cut for a request keeps the rest free; best fit takes the smallest
    FreeBlocks fb;
    Segment a, c;
    Block* big = segment(a, 0x10000000, 64 * MiB, false, s1);
    fb.cut(big, 8 * MiB);
    big->allocated = true;
    Block* mid = segment(c, 0x20000000, 20 * MiB, false, s1);
    fb.add(mid);
    check("cut_keeps_rest", layout(a) == "8192a 57344f ", layout(a));
    Block* got = fb.take(16 * MiB, s1, false);
    check("best_fit", got == mid && got->size == 16 * MiB, layout(c));
    check("best_fit_rest", layout(c) == "16384f 4096f ", layout(c));
    check("other_stream_not_served", fb.take(MiB, s2, false) == nullptr);
    check("small_pool_apart", fb.take(1024, s1, true) == nullptr);
    check("bytes", fb.bytes() == 56 * MiB + 4 * MiB, std::to_string(fb.bytes()));
  }
  {  // a large remainder under 1 MiB is not split off; a small one of 512 bytes is
    FreeBlocks fb;
    Segment a, b;
    Block* l = segment(a, 0x30000000, 2 * MiB, false, s1);
    fb.cut(l, 2 * MiB - 512 * 1024);
    check("large_rest_kept_whole", l->size == 2 * MiB && !l->next, layout(a));
    Block* s = segment(b, 0x40000000, 2 * MiB, true, s1);
    fb.cut(s, 2 * MiB - 512);
    check("small_rest_split", s->size == 2 * MiB - 512 && s->next && s->next->size == 512, layout(b));
  }
  {  // freeing merges with free neighbours on both sides, not with allocated ones
    FreeBlocks fb;
    Segment a;
    Block* x = segment(a, 0x50000000, 8 * MiB, false, s1);
    fb.cut(x, 2 * MiB);  // x | rest(6)
    x->allocated = true;
    Block* y = fb.take(2 * MiB, s1, false);  // x | y | rest(4)
    y->allocated = true;
    Block* z = fb.take(2 * MiB, s1, false);  // x | y | z | rest(2)
    z->allocated = true;
    check("three_cut", layout(a) == "2048a 2048a 2048a 2048f ", layout(a));
    x->allocated = false;
    fb.add(x);
    z->allocated = false;
    fb.add(z);
    check("merge_right", layout(a) == "2048f 2048a 4096f ", layout(a));
    y->allocated = false;
    fb.add(y);
    check("merge_both", layout(a) == "8192f " && a.first->next == nullptr, layout(a));
    check("merged_listed_once", fb.bytes() == 8 * MiB, std::to_string(fb.bytes()));
    Block* again = fb.take(8 * MiB, s1, false);
    check("whole_again", again == a.first && again->size == 8 * MiB);
  }
  {  // a neighbour still waiting for events is not merged; remove() unlists
    FreeBlocks fb;
    Segment a;
    Block* x = segment(a, 0x60000000, 4 * MiB, false, s1);
    fb.cut(x, 2 * MiB);
    Block* rest = x->next;
    x->allocated = true;
    fb.remove(rest);
    rest->events = 1;  // pretend another stream still uses it
    x->allocated = false;
    fb.add(x);
    check("pending_not_merged", layout(a) == "2048f 2048p ", layout(a));
    check("pending_not_listed", fb.bytes() == 2 * MiB, std::to_string(fb.bytes()));
    fb.remove(x);
    check("removed", fb.bytes() == 0 && fb.take(MiB, s1, false) == nullptr);
  }
  {  // a large segment's page: the large page where it divides the request, smaller
     // pages where the large one would leave more than 1/32 unused, never under 8 MiB
    const size_t L = 64 * MiB;
    check("page_exact", segment_page(256 * MiB, L) == L, std::to_string(segment_page(256 * MiB, L) >> 20));
    check("page_half", segment_page(288 * MiB, L) == 32 * MiB, std::to_string(segment_page(288 * MiB, L) >> 20));
    check("page_small_waste", segment_page(774 * MiB, L) == 16 * MiB, std::to_string(segment_page(774 * MiB, L) >> 20));
    check("page_least_waste", segment_page(100 * MiB, L) == 8 * MiB, std::to_string(segment_page(100 * MiB, L) >> 20));
    check("page_large_enough", segment_page(2000 * MiB, L) == L, std::to_string(segment_page(2000 * MiB, L) >> 20));
    check("page_upstream_20", segment_page(30 * MiB, 20 * MiB) == 10 * MiB, std::to_string(segment_page(30 * MiB, 20 * MiB) >> 20));
  }
  {  // growth: a new segment maps what the request needs, in whole pages
    FreeBlocks fb;
    Segment seg;
    Block* u = expandable(seg, fb, "32u", s1);
    Growth g = plan_growth(seg, 3 * MiB);
    check("grow_new", g.start == u && g.map_bytes == 4 * MiB, std::to_string(g.map_bytes >> 20));
    split_unmapped(u, 4 * MiB);
    u->mapped = true;
    fb.cut(merge_run(u, u), 3 * MiB);
    u->allocated = true;
    check("grow_new_layout", layout(seg) == "3072a 1024f 28672u ", layout(seg));
  }
  {  // of the runs that hold a request, the one that maps least; a free block
     // still waiting for events ends a run
    FreeBlocks fb;
    Segment seg;
    expandable(seg, fb, "4a 2f 2a 1f 23u", s1);
    Growth g = plan_growth(seg, 3 * MiB);
    check("grow_least_map", g.start && g.start->size == MiB && g.map_bytes == 2 * MiB,
          std::to_string(g.map_bytes >> 20));
    Segment seg2;
    FreeBlocks fb2;
    expandable(seg2, fb2, "4u 2a 1f 1p 6u", s1);
    Growth h = plan_growth(seg2, 5 * MiB);  // not 1f+1p+6u (4 MiB to map): the last block
    check("grow_pending_ends_run", h.start && h.start->size == 6 * MiB && !h.start->next &&
          h.map_bytes == 6 * MiB, std::to_string(h.map_bytes >> 20));
    check("grow_none", plan_growth(seg2, 7 * MiB).start == nullptr);
    check("grow_all_mapped_run", plan_growth(seg, 2 * MiB).map_bytes == 0);
  }
  {  // a run of free and newly mapped blocks merges into one; a free block
     // does not merge with an unmapped neighbour
    FreeBlocks fb;
    Segment seg;
    Block* a = expandable(seg, fb, "2a 1f 4u 2u", s1);
    Block* f = a->next;
    Block* u = f->next;
    fb.remove(f);
    u->mapped = true;
    Block* run = merge_run(f, u);
    check("merge_run", run == f && layout(seg) == "2048a 5120f 2048u ", layout(seg));
    fb.add(run);
    check("free_not_merged_with_unmapped", layout(seg) == "2048a 5120f 2048u " &&
          fb.bytes() == 5 * MiB, layout(seg));
  }
  {  // releasing: the whole pages of a free block become unmapped, merged with
     // unmapped neighbours; its bytes before and after stay free and mapped
    FreeBlocks fb;
    Segment seg;
    Block* a = expandable(seg, fb, "1a 8f 1a 4u", s1);
    Block* f = a->next;
    PageSpan span = whole_pages(seg, *f);
    check("whole_pages", span.first == 1 && span.count == 3,  // [2, 8) MiB of [1, 9)
          std::to_string(span.first) + "+" + std::to_string(span.count));
    fb.remove(f);
    Rest rest = carve_unmapped(f, span);
    check("carve_layout", layout(seg) == "1024a 1024f 6144u 1024f 1024a 4096u ", layout(seg));
    check("carve_rest", rest.head == f && f->size == MiB && rest.tail && rest.tail->size == MiB);
    Segment seg2;
    FreeBlocks fb2;
    Block* g = expandable(seg2, fb2, "2u 4f 2u", s1);
    Block* mid = g->next;
    fb2.remove(mid);
    Rest r2 = carve_unmapped(mid, whole_pages(seg2, *mid));
    check("carve_merges_unmapped", layout(seg2) == "8192u " && !r2.head && !r2.tail, layout(seg2));
    Segment seg3;
    FreeBlocks fb3;
    Block* h = expandable(seg3, fb3, "1a 2f 1a", s1);
    check("no_whole_page", whole_pages(seg3, *h->next).count == 0);
  }
  return failures ? 1 : 0;
}
