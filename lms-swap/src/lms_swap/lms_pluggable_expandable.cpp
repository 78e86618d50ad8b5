// The pluggable LMS allocator's expandable segments: see
// lms_pluggable_expandable.h.
#include "lms_pluggable_expandable.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace lms_pluggable {

namespace {

size_t round_up(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

// a new expandable segment's address space, in device sizes
constexpr size_t kAddressSpacePerDevice = 4;

} // namespace

bool expandable_segments_setting() {
  for (const char* var : {"PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"}) {
    const char* v = std::getenv(var);
    if (!v) {
      continue;
    }
    std::string conf;
    for (const char* c = v; *c; ++c) {
      if (!std::isspace(static_cast<unsigned char>(*c))) {
        conf += static_cast<char>(std::tolower(static_cast<unsigned char>(*c)));
      }
    }
    size_t at = 0;
    while (at <= conf.size()) {
      const size_t end = std::min(conf.find(',', at), conf.size());
      const std::string item = conf.substr(at, end - at);
      if (item.rfind("expandable_segments:", 0) == 0) {
        return item.substr(20) == "true";
      }
      at = end + 1;
    }
    return false;
  }
  return false;
}

Growth ExpandableSegments::best_growth(size_t size, cudaStream_t stream) const {
  Growth best;
  for (const auto& s : segments_.all()) {
    if (s->expandable && s->first->stream == stream) {
      const Growth g = plan_growth(*s, size);
      if (g.start && (!best.start || g.map_bytes < best.map_bytes)) {
        best = g;
      }
    }
  }
  return best;
}

size_t ExpandableSegments::new_bytes(
    size_t size,
    cudaStream_t stream,
    size_t page) const {
  const Growth g = best_growth(size, stream);
  const size_t fresh = round_up(size, page);
  return g.start && g.map_bytes < fresh ? g.map_bytes : fresh;
}

Block* ExpandableSegments::grow(
    size_t size,
    cudaStream_t stream,
    size_t page,
    size_t device_total) {
  Growth best = best_growth(size, stream);
  if (!best.start) {
    // Address space is cheap and a wide range fragments less: pages LMS moved
    // to host memory keep their addresses, so the range outgrows the device.
    // A request no range of the stream holds gets a segment more.
    best.start = segments_.reserve(
        round_up(std::max(size, kAddressSpacePerDevice * device_total), page),
        page,
        stream);
  }
  Segment* seg = best.start->seg;
  size_t covered = 0;
  Block* last = nullptr;
  bool ok = true;
  for (Block* b = best.start; covered < size; b = b->next) {
    if (b->mapped) {
      free_.remove(b);
    } else {
      const size_t need = std::min(b->size, round_up(size - covered, seg->page));
      if (!segments_.map_pages(seg, seg->page_index(b->ptr), need / seg->page)) {
        ok = false;
        break;
      }
      if (need < b->size) {
        split_unmapped(b, need);
      }
      b->mapped = true;
    }
    covered += b->size;
    last = b;
  }
  if (!last) {
    return nullptr;
  }
  Block* run = merge_run(best.start, last);
  if (!ok) {
    free_.add(run);
    return nullptr;
  }
  // pages mapped up to a free block (one that releasing cut from the same
  // free range) join it, so that what the request leaves is one free block
  Block* next = run->next;
  if (next && next->mapped && !next->allocated && next->events == 0) {
    free_.remove(next);
    run = merge_run(run, next);
  }
  free_.cut(run, size);
  return run;
}

ExpandableSegments::Kept ExpandableSegments::growth_run(
    size_t size,
    cudaStream_t stream) const {
  Kept run;
  const Growth g = best_growth(size, stream);
  size_t covered = 0;
  for (const Block* b = g.start; b && covered < size; b = b->next) {
    if (b->mapped) {
      run.push_back(b);
    }
    covered += b->size;
  }
  return run;
}

ExpandableSegments::Spans ExpandableSegments::free_pages(const Kept& keep) const {
  Spans spans;
  for (const auto& s : segments_.all()) {
    if (!s->expandable) {
      continue;
    }
    for (Block* b = s->first; b; b = b->next) {
      if (b->mapped && !b->allocated && b->events == 0 && !kept(keep, b)) {
        const PageSpan span = whole_pages(*s, *b);
        if (span.count) {
          spans.emplace_back(b, span);
        }
      }
    }
  }
  return spans;
}

ExpandableSegments::Spans ExpandableSegments::largest_free_pages(
    size_t at_least,
    const Kept& keep) const {
  const Spans all = free_pages(keep);
  // each run's device bytes once (bytes, index in `all`), largest first
  std::vector<std::pair<size_t, size_t>> order;
  order.reserve(all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    const auto& [block, span] = all[i];
    order.emplace_back(block->seg->device_bytes(span.first, span.count), i);
  }
  std::sort(order.begin(), order.end(), std::greater<>());
  Spans taken;
  size_t planned = 0;
  for (const auto& [run_bytes, i] : order) {
    if (planned >= at_least) {
      break;
    }
    auto [block, span] = all[i];
    if (planned + run_bytes > at_least) {
      const Segment& seg = *block->seg;
      size_t first = span.first + span.count;
      while (first > span.first && planned < at_least) {
        planned += seg.device_bytes(--first, 1);
      }
      span.count -= first - span.first;
      span.first = first;
    } else {
      planned += run_bytes;
    }
    taken.emplace_back(block, span);
  }
  return taken;
}

namespace {

// The pages of b's whole pages that are on the host, first to last ({0, 0}:
// none, or b is not a mapped block of an expandable segment).
PageSpan host_span(const Block& b) {
  const Segment& s = *b.seg;
  PageSpan out;
  if (!s.expandable || !b.mapped) {
    return out;
  }
  const PageSpan whole = whole_pages(s, b);
  for (size_t i = whole.first; i < whole.first + whole.count; ++i) {
    if (s.on_host[i]) {
      if (out.count == 0) {
        out.first = i;
      }
      out.count = i + 1 - out.first;
    }
  }
  return out;
}

} // namespace

bool ExpandableSegments::holds_host_pages(const Block& b) const {
  return host_span(b).count > 0;
}

void ExpandableSegments::list_dropping_host_pages(Block* b) {
  const PageSpan span = host_span(*b);
  if (span.count == 0) {
    free_.add(b);
    return;
  }
  segments_.unmap_pages(b->seg, span.first, span.count);
  const Rest rest = carve_unmapped(b, span);
  for (Block* m : {rest.head, rest.tail}) {
    if (m) {
      free_.add(m);
    }
  }
}

void ExpandableSegments::unmap(const Spans& spans) {
  // no two free blocks with no events are neighbours (FreeBlocks::add merges
  // them), so listing one block's rest never merges another span's block
  for (const auto& [b, span] : spans) {
    free_.remove(b);
    segments_.unmap_pages(b->seg, span.first, span.count);
    const Rest rest = carve_unmapped(b, span);
    for (Block* m : {rest.head, rest.tail}) {
      if (m) {
        free_.add(m);
      }
    }
  }
}

} // namespace lms_pluggable
