// The pluggable LMS allocator's walks over its pages for the core: see
// lms_pluggable_page_walks.h.
#include "lms_pluggable_page_walks.h"

#include <algorithm>
#include <unordered_map>
#include <utility>

namespace lms_pluggable {

using c10::cuda::CUDACachingAllocator::lms::impl::PageRef;

std::vector<PageRef> movable_pages(
    const std::vector<std::unique_ptr<Segment>>& segments,
    bool host,
    size_t min_size) {
  std::vector<PageRef> out;
  for (const auto& sp : segments) {
    Segment* s = sp.get();
    if (s->small) {
      continue;
    }
    Block* b = s->first;
    for (size_t i = 0; i < s->handles.size(); ++i) {
      if (!s->mapped[i] || s->on_host[i] != host) {
        continue;
      }
      char* lo = s->page_ptr(i);
      char* hi = lo + s->page;
      while (b && b->ptr + b->size <= lo) {
        b = b->next;
      }
      PageRef p;
      p.seg = s;
      p.idx = i;
      bool ok = true;
      bool any_allocated = false;
      for (Block* c = b; c && c->ptr < hi; c = c->next) {
        if (c->events > 0 || (!host && c->allocated && c->size < min_size)) {
          ok = false;
          break;
        }
        if (c->allocated) {
          any_allocated = true;
          p.tick = std::max(p.tick, c->tick);
        }
        p.streams.push_back(c->stream);
        p.streams.insert(p.streams.end(), c->uses.begin(), c->uses.end());
      }
      if (ok && (host || any_allocated)) {
        out.push_back(std::move(p));
      }
    }
  }
  return out;
}

size_t busiest_large_page(
    const std::vector<std::unique_ptr<Segment>>& segments,
    size_t otherwise) {
  std::unordered_map<size_t, size_t> bytes_by_page;
  for (const auto& s : segments) {
    for (const Block* b = s->first; b && !s->small; b = b->next) {
      if (b->allocated) {
        bytes_by_page[s->page] += b->size;
      }
    }
  }
  size_t page = otherwise;
  size_t most = 0;
  for (const auto& kv : bytes_by_page) {
    if (kv.second > most) {
      page = kv.first;
      most = kv.second;
    }
  }
  return page;
}

} // namespace lms_pluggable
