// Drives the pluggable LMS allocator's walks over its pages
// (lms_pluggable_page_walks.h: which pages the core may move, and the page
// size most allocated bytes sit on) on hand-made segments, with no GPU: each
// check prints "ok <name>" or "FAIL <name>: <why>"
// (tests/test_lms_pluggable_allocator.py reads them).
#include "lms_pluggable_page_walks.h"

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

using namespace lms_pluggable;
using c10::cuda::CUDACachingAllocator::lms::impl::PageRef;

namespace {

constexpr size_t MiB = size_t(1) << 20;
int failures = 0;

void check(const char* name, bool ok, const std::string& why = "") {
  std::printf("%s %s%s%s\n", ok ? "ok" : "FAIL", name, ok ? "" : ": ", ok ? "" : why.c_str());
  failures += ok ? 0 : 1;
}

cudaStream_t stream(uintptr_t n) {
  return reinterpret_cast<cudaStream_t>(n);
}

// A segment of `pages` pages of `page` bytes at `base`, every page mapped on
// the device, its blocks as `spec` says: {MiB, allocated, tick, events}.
struct Spec {
  size_t mib;
  bool allocated;
  uint64_t tick;
  int events;
};
std::unique_ptr<Segment> segment(uintptr_t base, size_t page, size_t pages,
                                 const std::vector<Spec>& spec, bool small = false) {
  auto seg = std::make_unique<Segment>();
  seg->base = base;
  seg->page = page;
  seg->size = page * pages;
  seg->small = small;
  seg->handles.assign(pages, 1);
  seg->mapped.assign(pages, true);
  seg->on_host.assign(pages, false);
  Block* prev = nullptr;
  size_t at = 0;
  for (const Spec& s : spec) {
    auto* b = new Block();
    b->ptr = reinterpret_cast<char*>(base + at);
    b->size = s.mib * MiB;
    b->stream = stream(1);
    b->seg = seg.get();
    b->allocated = s.allocated;
    b->tick = s.tick;
    b->events = s.events;
    b->prev = prev;
    (prev ? prev->next : seg->first) = b;
    prev = b;
    at += b->size;
  }
  return seg;
}

std::string pages_of(const std::vector<PageRef>& refs) {
  std::string out;
  for (const PageRef& p : refs) {
    out += std::to_string(p.idx) + "@" + std::to_string(p.tick) + " ";
  }
  return out;
}

} // namespace

int main() {
  std::vector<std::unique_ptr<Segment>> segs;
  // pages of 2 MiB: [0,4) A allocated tick 5 | [4,5) B allocated 1 MiB tick 9
  // | [5,8) free | [8,12) C allocated tick 7, waiting for an event | [12,16)
  // D allocated tick 3 and E allocated tick 8, sharing page 6 at 13 MiB
  segs.push_back(segment(0x100000000ULL, 2 * MiB, 8,
                         {{4, true, 5, 0}, {1, true, 9, 0}, {3, false, 0, 0},
                          {4, true, 7, 1}, {1, true, 3, 0}, {3, true, 8, 0}}));
  const auto dev = movable_pages(segs, /*host=*/false, 2 * MiB);
  // page 2 holds B (under the 2 MiB floor); page 3 only free bytes; pages 4
  // and 5 C with its event; page 6 D (1 MiB) and E: D is under the floor
  check("device pages: only those whose allocated blocks are all large, none waiting",
        pages_of(dev) == "0@5 1@5 7@8 ", pages_of(dev));
  const auto low = movable_pages(segs, /*host=*/false, 1 * MiB);
  check("a lower floor lets small blocks' pages move, the tick the newest on the page",
        pages_of(low) == "0@5 1@5 2@9 6@8 7@8 ", pages_of(low));

  // page 2 and page 3 on the host: they come back whatever lies on them (a
  // block under the floor, free bytes); the event still holds page 4
  Segment& s = *segs[0];
  s.on_host[2] = s.on_host[3] = s.on_host[4] = true;
  const auto host = movable_pages(segs, /*host=*/true, 2 * MiB);
  check("host pages come back whatever lies on them, not under an event",
        pages_of(host) == "2@9 3@0 ", pages_of(host));
  const auto dev2 = movable_pages(segs, /*host=*/false, 1 * MiB);
  check("a page on the host is not a device page",
        pages_of(dev2) == "0@5 1@5 6@8 7@8 ", pages_of(dev2));

  // an unmapped page is neither
  s.mapped[0] = false;
  const auto dev3 = movable_pages(segs, /*host=*/false, 1 * MiB);
  check("an unmapped page is not listed", pages_of(dev3) == "1@5 6@8 7@8 ", pages_of(dev3));

  // every stream that may use a page: its blocks' streams and recorded uses
  Block* e = s.first->next->next->next->next->next;
  e->uses = {stream(2), stream(3)};
  s.first->next->next->next->next->stream = stream(4); // D
  const auto dev4 = movable_pages(segs, /*host=*/false, 1 * MiB);
  const PageRef& p6 = dev4[1];
  check("a page's streams: each block's and its recorded uses",
        p6.idx == 6 && p6.streams.size() == 4 && p6.streams[0] == stream(4) &&
            p6.streams[1] == stream(1) && p6.streams[2] == stream(2) &&
            p6.streams[3] == stream(3),
        std::to_string(p6.idx) + " " + std::to_string(p6.streams.size()));

  // the small pool's segments never move
  segs.push_back(segment(0x200000000ULL, 2 * MiB, 1, {{2, true, 11, 0}}, /*small=*/true));
  const auto dev5 = movable_pages(segs, /*host=*/false, 1 * MiB);
  check("small segments' pages are not listed", pages_of(dev5) == pages_of(dev4),
        pages_of(dev5));

  // the busiest large page: by allocated bytes per page size, small segments
  // left out; `otherwise` where nothing large is allocated
  std::vector<std::unique_ptr<Segment>> by_page;
  check("no segment: the page it is told", busiest_large_page(by_page, 64 * MiB) == 64 * MiB);
  by_page.push_back(segment(0x300000000ULL, 20 * MiB, 2, {{40, false, 0, 0}}));
  by_page.push_back(segment(0x400000000ULL, 2 * MiB, 1, {{2, true, 1, 0}}, /*small=*/true));
  check("free large and small allocated: the page it is told",
        busiest_large_page(by_page, 64 * MiB) == 64 * MiB);
  by_page.push_back(segment(0x500000000ULL, 8 * MiB, 2, {{16, true, 2, 0}}));
  by_page.push_back(segment(0x600000000ULL, 20 * MiB, 1, {{10, true, 3, 0}, {10, false, 0, 0}}));
  check("the page size holding most allocated bytes",
        busiest_large_page(by_page, 64 * MiB) == 8 * MiB,
        std::to_string(busiest_large_page(by_page, 64 * MiB) / MiB));
  by_page.push_back(segment(0x700000000ULL, 20 * MiB, 1, {{20, true, 4, 0}}));
  check("summed over segments of one page size",
        busiest_large_page(by_page, 64 * MiB) == 20 * MiB,
        std::to_string(busiest_large_page(by_page, 64 * MiB) / MiB));

  for (auto* v : {&segs, &by_page}) {
    for (auto& sp : *v) {
      for (Block* b = sp->first; b;) {
        Block* n = b->next;
        delete b;
        b = n;
      }
    }
  }
  return failures == 0 ? 0 : 1;
}
