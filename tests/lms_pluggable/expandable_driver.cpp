// Drives lms_pluggable::ExpandableSegments (the pluggable LMS allocator's
// expandable segments: growth into runs of free and unmapped blocks, release
// of free pages, host pages of freed blocks dropped) over a stand-in for the
// driver's pages, with no GPU: a few thousand random allocations, frees,
// moves of a block's pages to the host and releases (of all free pages, or
// part way, largest runs first) under a device budget,
// checking after each that the blocks still describe the pages. Prints
// "ok <name>" or "FAIL <name>: <why>" (tests/test_lms_pluggable_allocator.py
// reads them).
#include "lms_pluggable_expandable.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace lms_pluggable;

namespace {

constexpr size_t MiB = size_t(1) << 20;
int failures = 0;
std::string first_error;

void fail(const std::string& why) {
  if (first_error.empty()) {
    first_error = why;
  }
}

// Pages as a driver keeps them: a page is mapped or not, and the device has
// room for `budget` bytes of mapped pages.
class FakePages final : public PageMapper {
 public:
  explicit FakePages(size_t budget) : budget_(budget) {}

  const std::vector<std::unique_ptr<Segment>>& all() const override {
    return segments_;
  }
  Block* reserve(size_t size, size_t page, cudaStream_t stream) override {
    auto seg = std::make_unique<Segment>();
    seg->base = next_base_;
    next_base_ += size + (size_t(1) << 30); // a gap: segments never touch
    seg->size = size;
    seg->page = page;
    seg->expandable = true;
    seg->handles.assign(size / page, 0);
    seg->mapped.assign(size / page, false);
    seg->on_host.assign(size / page, false);
    auto* b = new Block();
    b->ptr = reinterpret_cast<char*>(seg->base);
    b->size = size;
    b->stream = stream;
    b->seg = seg.get();
    b->mapped = false;
    seg->first = b;
    segments_.push_back(std::move(seg));
    ++reserved_;
    return b;
  }
  bool map_pages(Segment* s, size_t first, size_t count) override {
    if (mapped_ + count * s->page > budget_) {
      return false;
    }
    for (size_t i = first; i < first + count; ++i) {
      if (s->mapped.at(i)) {
        fail("page " + std::to_string(i) + " mapped twice");
      }
      s->mapped[i] = true;
      s->on_host[i] = false;
      s->handles[i] = 1;
    }
    mapped_ += count * s->page;
    return true;
  }
  void unmap_pages(Segment* s, size_t first, size_t count) override {
    const char* lo = s->page_ptr(first);
    const char* hi = s->page_ptr(first + count);
    for (const Block* b = s->first; b; b = b->next) {
      if (b->allocated && b->ptr < hi && b->ptr + b->size > lo) {
        fail("a page under an allocated block unmapped");
      }
    }
    for (size_t i = first; i < first + count; ++i) {
      if (!s->mapped.at(i)) {
        fail("page " + std::to_string(i) + " unmapped twice");
      }
      if (s->on_host[i]) {
        ++host_dropped_;
      }
      s->mapped[i] = false;
      s->on_host[i] = false;
      s->handles[i] = 0;
    }
    mapped_ -= count * s->page;
  }
  size_t mapped() const {
    return mapped_;
  }
  int reserved() const {
    return reserved_;
  }
  int host_dropped() const {
    return host_dropped_;
  }

 private:
  const size_t budget_;
  size_t mapped_ = 0;
  int reserved_ = 0;
  int host_dropped_ = 0; // host pages unmapped
  CUdeviceptr next_base_ = 0x100000000000ULL;
  std::vector<std::unique_ptr<Segment>> segments_;
};

// The blocks describe the pages: they cover each segment in address order; an
// unmapped block is whole pages, none mapped; every page under a mapped block
// is mapped and every mapped page lies under one; no two free mapped blocks
// are neighbours; the free lists hold exactly the free mapped blocks.
void check_layout(const FakePages& pages, const FreeBlocks& fb) {
  size_t free_bytes = 0;
  for (const auto& sp : pages.all()) {
    const Segment& s = *sp;
    const char* at = reinterpret_cast<const char*>(s.base);
    std::vector<bool> under_mapped(s.mapped.size(), false);
    for (const Block* b = s.first; b; b = b->next) {
      if (b->ptr != at || b->size == 0 || (b->next && b->next->prev != b)) {
        return fail("blocks do not cover the segment in order");
      }
      const size_t lo = static_cast<size_t>(b->ptr - reinterpret_cast<const char*>(s.base));
      const size_t first = lo / s.page;
      const size_t end = (lo + b->size + s.page - 1) / s.page;
      if (!b->mapped) {
        if (lo % s.page || b->size % s.page || b->allocated) {
          return fail("an unmapped block that is not whole free pages");
        }
        for (size_t i = first; i < end; ++i) {
          if (s.mapped[i]) {
            return fail("a mapped page under an unmapped block");
          }
        }
        if (b->next && !b->next->mapped) {
          return fail("two unmapped neighbours");
        }
      } else {
        for (size_t i = first; i < end; ++i) {
          if (!s.mapped[i]) {
            return fail("a mapped block over an unmapped page");
          }
          under_mapped[i] = true;
        }
        if (!b->allocated) {
          free_bytes += b->size;
          if (b->next && b->next->mapped && !b->next->allocated) {
            return fail("two free mapped neighbours");
          }
        }
      }
      at += b->size;
    }
    if (at != reinterpret_cast<const char*>(s.base) + s.size) {
      return fail("blocks end before the segment");
    }
    for (size_t i = 0; i < s.mapped.size(); ++i) {
      if (s.mapped[i] && !under_mapped[i]) {
        return fail("a mapped page under no mapped block");
      }
    }
  }
  if (fb.bytes() != free_bytes) {
    fail("free lists hold " + std::to_string(fb.bytes()) + " bytes, free blocks " +
         std::to_string(free_bytes));
  }
}

size_t device_bytes_of(const ExpandableSegments::Spans& spans) {
  size_t n = 0;
  for (const auto& [block, span] : spans) {
    n += block->seg->device_bytes(span.first, span.count);
  }
  return n;
}

// largest_free_pages(at_least, keep) against free_pages(keep): each span it takes is
// the end of one free run; the runs it takes whole hold at least the device
// bytes of any run it leaves; it takes at least `at_least` device bytes and
// less than a page more, or, where the free pages hold less, every run.
// Returns the spans it took; `part_way`: whether they left free device bytes
// out.
ExpandableSegments::Spans check_largest_free_pages(
    const ExpandableSegments& growth, size_t at_least,
    const ExpandableSegments::Kept& keep, bool& part_way) {
  part_way = false;
  const ExpandableSegments::Spans all = growth.free_pages(keep);
  ExpandableSegments::Spans taken = growth.largest_free_pages(at_least, keep);
  const size_t free_bytes = device_bytes_of(all);
  const size_t took = device_bytes_of(taken);
  size_t smallest_whole = ~size_t(0), largest_left = 0, page = 0;
  std::vector<const Block*> seen;
  for (const auto& [block, span] : taken) {
    page = block->seg->page;
    const auto run = std::find_if(all.begin(), all.end(), [&](const auto& a) {
      return a.first == block;
    });
    if (run == all.end() || std::find(seen.begin(), seen.end(), block) != seen.end()) {
      fail("largest_free_pages: a span of no free run, or of one run twice");
      return taken;
    }
    seen.push_back(block);
    const PageSpan& whole = run->second;
    if (span.count == 0 || span.first < whole.first ||
        span.first + span.count != whole.first + whole.count) {
      fail("largest_free_pages: a span that is not the end of its run");
      return taken;
    }
    if (span.count == whole.count) {
      smallest_whole = std::min(
          smallest_whole, block->seg->device_bytes(span.first, span.count));
    }
  }
  for (const auto& [block, span] : all) {
    if (std::find(seen.begin(), seen.end(), block) == seen.end()) {
      largest_left = std::max(largest_left, block->seg->device_bytes(span.first, span.count));
    }
  }
  if (free_bytes < at_least) {
    if (taken.size() != all.size() || took != free_bytes) {
      fail("largest_free_pages: not every run where all were too few");
    }
    return taken;
  }
  if (took < at_least || (page && took >= at_least + page)) {
    fail("largest_free_pages: " + std::to_string(took) + " bytes for " +
         std::to_string(at_least));
  }
  if (smallest_whole != ~size_t(0) && smallest_whole < largest_left) {
    fail("largest_free_pages: a smaller run taken before a larger one");
  }
  part_way = took < free_bytes;
  return taken;
}

void check(const char* name, bool ok, const std::string& why = "") {
  std::printf("%s %s%s%s\n", ok ? "ok" : "FAIL", name, ok ? "" : ": ", ok ? "" : why.c_str());
  failures += ok ? 0 : 1;
}

} // namespace

int main() {
  const size_t page = 2 * MiB;
  const size_t device = 256 * MiB;
  auto* s1 = reinterpret_cast<cudaStream_t>(0x1000);
  FakePages pages(device);
  FreeBlocks fb;
  ExpandableSegments growth(pages, fb);
  std::mt19937 rng(20261128);
  const size_t sizes[] = {1 * MiB, 3 * MiB, 7 * MiB + 512, 20 * MiB, 33 * MiB, 64 * MiB, 130 * MiB};
  std::vector<Block*> live;
  int grown = 0, served_free = 0, released = 0, refused = 0, predicted = 0;
  int freed_on_host = 0;
  int part_way = 0; // part-way picks that left free device pages out
  int kept_runs = 0; // releases that left a request's free run mapped
  for (int op = 0; op < 4000 && first_error.empty(); ++op) {
    const unsigned r = rng() % 10;
    if (r < 5) {
      const size_t size = sizes[rng() % (sizeof(sizes) / sizeof(sizes[0]))];
      Block* b = fb.take(size, s1, false);
      if (b) {
        ++served_free;
      } else {
        const size_t want = growth.new_bytes(size, s1, page);
        const size_t before = pages.mapped();
        b = growth.grow(size, s1, page, device);
        if (!b) {  // as the allocator's LMS does: release free pages, once more
          growth.unmap(growth.free_pages(growth.growth_run(size, s1)));
          ++released;
          const size_t again = growth.new_bytes(size, s1, page);
          const size_t at = pages.mapped();
          b = growth.grow(size, s1, page, device);
          if (b && pages.mapped() - at == again) {
            ++predicted;
          }
        } else if (pages.mapped() - before == want) {
          ++predicted;
        }
        if (b) {
          ++grown;
        } else {
          ++refused;
        }
      }
      if (b) {
        if (b->size < size || !b->mapped || b->allocated) {
          fail("a block that does not hold its request");
        }
        b->allocated = true;
        live.push_back(b);
      }
    } else if (r < 8 && !live.empty()) {
      const size_t i = rng() % live.size();
      Block* b = live[i];
      live.erase(live.begin() + static_cast<long>(i));
      b->allocated = false;
      if (growth.holds_host_pages(*b)) {
        ++freed_on_host;
      }
      Segment& s = *b->seg;
      const size_t lo = static_cast<size_t>(b->ptr - reinterpret_cast<char*>(s.base));
      const size_t hi = lo + b->size;
      growth.list_dropping_host_pages(b);
      // none of its whole pages is left on the host (pages it shares with a
      // neighbour stay until a release: the neighbour's stream may use them)
      for (size_t i = (lo + s.page - 1) / s.page; i < hi / s.page; ++i) {
        if (s.on_host[i]) {
          fail("a freed block's whole page left on the host");
        }
      }
    } else if (r < 9 && !live.empty()) {
      // LMS moves the pages under a block to the host (pages it shares with a
      // neighbour too, as a page moves whole)
      Block* b = live[rng() % live.size()];
      Segment& s = *b->seg;
      const size_t lo = static_cast<size_t>(b->ptr - reinterpret_cast<char*>(s.base));
      for (size_t i = lo / s.page; i < (lo + b->size + s.page - 1) / s.page; ++i) {
        s.on_host[i] = true;
      }
    } else {
      // a release part way, as the allocator's LMS asks for room for a
      // request, or of all (every other time; the part-way pick is checked
      // then too, unused): it leaves the run the request grows into, so the
      // request maps after it what it would have mapped before
      const size_t size = sizes[rng() % (sizeof(sizes) / sizeof(sizes[0]))];
      const ExpandableSegments::Kept keep = growth.growth_run(size, s1);
      const size_t want = growth.new_bytes(size, s1, page);
      const bool all = rng() % 2 == 0;
      bool left_some = false;
      const ExpandableSegments::Spans some = check_largest_free_pages(
          growth, (1 + rng() % 96) * MiB, keep, left_some);
      const ExpandableSegments::Spans taken = all ? growth.free_pages(keep) : some;
      for (const auto& [block, span] : taken) {
        if (ExpandableSegments::kept(keep, block)) {
          fail("a release took a page of the run its request grows into");
        }
      }
      part_way += left_some ? 1 : 0;
      growth.unmap(taken);
      ++released;
      if (!keep.empty()) {
        ++kept_runs;
        const size_t after = growth.new_bytes(size, s1, page);
        if (after != want) {
          fail("a release for a request changed what it maps: " + std::to_string(want) +
               " bytes before, " + std::to_string(after) + " after");
        }
      }
    }
    check_layout(pages, fb);
  }
  check("random_ops_keep_the_layout", first_error.empty(), first_error);
  check("random_ops_exercised_every_path",
        grown > 100 && served_free > 100 && released > 100 && refused > 0,
        std::to_string(grown) + " grown, " + std::to_string(served_free) + " from free lists, " +
            std::to_string(released) + " releases, " + std::to_string(refused) + " refused");
  check("largest_free_pages_takes_the_largest_runs_and_no_page_more",
        first_error.empty() && part_way > 20,
        std::to_string(part_way) + " part-way picks; " + first_error);
  check("freed_host_pages_go_back_to_the_host",
        freed_on_host > 100 && pages.host_dropped() > 100,
        std::to_string(freed_on_host) + " blocks freed on host pages, " +
            std::to_string(pages.host_dropped()) + " host pages unmapped");
  check("a_release_leaves_the_run_its_request_grows_into",
        first_error.empty() && kept_runs > 20,
        std::to_string(kept_runs) + " releases left a run; " + first_error);
  check("new_bytes_is_what_grow_maps", predicted == grown,
        std::to_string(predicted) + " of " + std::to_string(grown));
  check("one_segment_serves_the_stream", pages.reserved() == 1,
        std::to_string(pages.reserved()) + " segments");
  for (Block* b : live) {
    b->allocated = false;
    growth.list_dropping_host_pages(b);
  }
  growth.unmap(growth.free_pages());
  check_layout(pages, fb);
  check("all_freed_and_released_maps_nothing", pages.mapped() == 0 && first_error.empty(),
        std::to_string(pages.mapped()) + " bytes mapped; " + first_error);
  return failures ? 1 : 0;
}
