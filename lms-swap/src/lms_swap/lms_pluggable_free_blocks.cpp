// The pluggable LMS allocator's free blocks: see lms_pluggable_free_blocks.h.
#include "lms_pluggable_free_blocks.h"

namespace lms_pluggable {

Block* FreeBlocks::take(size_t size, cudaStream_t stream, bool small) {
  Pool& fl = pool(small);
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = fl.lower_bound(&key);
  if (it == fl.end() || (*it)->stream != stream) {
    return nullptr;
  }
  Block* b = *it;
  fl.erase(it);
  cut(b, size);
  return b;
}

void FreeBlocks::cut(Block* b, size_t size) {
  const bool small = b->seg->small;
  const size_t rest = b->size - size;
  if (small ? rest < kRound : rest < kMinLargeSplit) {
    return;
  }
  auto* r = new Block();
  r->ptr = b->ptr + size;
  r->size = rest;
  r->stream = b->stream;
  r->seg = b->seg;
  r->prev = b;
  r->next = b->next;
  if (b->next) {
    b->next->prev = r;
  }
  b->next = r;
  b->size = size;
  pool(small).insert(r);
}

void FreeBlocks::add(Block* b) {
  Pool& fl = pool(b->seg->small);
  // (the neighbours are read first: merging with prev replaces b)
  for (Block* n : {b->prev, b->next}) {
    if (!n || n->allocated || n->events > 0 || !n->mapped) {
      continue;
    }
    fl.erase(n);
    if (n == b->prev) {
      n->size += b->size;
      n->next = b->next;
      if (b->next) {
        b->next->prev = n;
      }
      delete b;
      b = n;
    } else {
      b->size += n->size;
      b->next = n->next;
      if (n->next) {
        n->next->prev = b;
      }
      delete n;
    }
  }
  fl.insert(b);
}

size_t FreeBlocks::bytes() const {
  size_t n = 0;
  for (const Pool* p : {&small_, &large_}) {
    for (const Block* b : *p) {
      n += b->size;
    }
  }
  return n;
}

} // namespace lms_pluggable
