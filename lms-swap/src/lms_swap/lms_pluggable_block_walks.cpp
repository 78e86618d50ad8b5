// The pluggable LMS allocator's expandable segments: see
// lms_pluggable_block_walks.h.
#include "lms_pluggable_block_walks.h"

namespace lms_pluggable {

namespace {

bool growable(const Block* b) {
  return !b->allocated && b->events == 0;
}

// A new block after b in its segment, of b's stream, covering [ptr, ptr + size).
Block* insert_after(Block* b, char* ptr, size_t size, bool mapped) {
  auto* n = new Block();
  n->ptr = ptr;
  n->size = size;
  n->stream = b->stream;
  n->seg = b->seg;
  n->mapped = mapped;
  n->prev = b;
  n->next = b->next;
  if (b->next) {
    b->next->prev = n;
  }
  b->next = n;
  return n;
}

// Folds b->next into b and deletes it.
void absorb_next(Block* b) {
  Block* n = b->next;
  b->size += n->size;
  b->next = n->next;
  if (n->next) {
    n->next->prev = b;
  }
  delete n;
}

} // namespace

Growth plan_growth(const Segment& s, size_t size) {
  Growth best;
  for (Block* start = s.first; start;) {
    if (!growable(start)) {
      start = start->next;
      continue;
    }
    // the run from start: what `size` bytes from it would map
    size_t covered = 0;
    size_t map = 0;
    Block* b = start;
    for (; b && growable(b) && covered < size; b = b->next) {
      if (!b->mapped) {
        const size_t want = size - covered;
        map += want >= b->size ? b->size : (want + s.page - 1) / s.page * s.page;
      }
      covered += b->size;
    }
    if (covered >= size && (!best.start || map < best.map_bytes)) {
      best.start = start;
      best.map_bytes = map;
    }
    // the next run begins past this one
    while (b && growable(b)) {
      b = b->next;
    }
    start = b;
  }
  return best;
}

void split_unmapped(Block* b, size_t keep) {
  insert_after(b, b->ptr + keep, b->size - keep, /*mapped=*/false);
  b->size = keep;
}

Block* merge_run(Block* first, Block* last) {
  while (first != last) {
    const bool end = first->next == last;
    absorb_next(first);
    if (end) {
      break;
    }
  }
  return first;
}

PageSpan whole_pages(const Segment& s, const Block& b) {
  const size_t lo = static_cast<size_t>(b.ptr - reinterpret_cast<char*>(s.base));
  const size_t hi = lo + b.size;
  const size_t first = (lo + s.page - 1) / s.page;
  const size_t end = hi / s.page;
  PageSpan span;
  if (end > first) {
    span.first = first;
    span.count = end - first;
  }
  return span;
}

Rest carve_unmapped(Block* b, PageSpan span) {
  const Segment& s = *b->seg;
  char* lo = s.page_ptr(span.first);
  char* hi = s.page_ptr(span.first + span.count);
  Rest rest;
  Block* mid = b;
  if (b->ptr < lo) {
    mid = insert_after(b, lo, static_cast<size_t>(b->ptr + b->size - lo), true);
    b->size = static_cast<size_t>(lo - b->ptr);
    rest.head = b;
  }
  if (mid->ptr + mid->size > hi) {
    rest.tail =
        insert_after(mid, hi, static_cast<size_t>(mid->ptr + mid->size - hi), true);
    mid->size = static_cast<size_t>(hi - mid->ptr);
  }
  mid->mapped = false;
  if (mid->next && !mid->next->mapped) {
    absorb_next(mid);
  }
  if (mid->prev && !mid->prev->mapped) {
    absorb_next(mid->prev);
  }
  return rest;
}

} // namespace lms_pluggable
