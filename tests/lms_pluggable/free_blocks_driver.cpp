// Drives lms_pluggable::FreeBlocks (the pluggable LMS allocator's free lists)
// on hand-made blocks, with no GPU: each check prints "ok <name>" or
// "FAIL <name>: <why>" (tests/test_lms_pluggable_allocator.py reads them).
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

// blocks of the segment, in address order, as "size[a|f]" ...
std::string layout(const Segment& seg) {
  std::string out;
  for (const Block* b = seg.first; b; b = b->next) {
    out += std::to_string(b->size >> 10) + (b->allocated ? "a " : "f ");
  }
  return out;
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
    check("pending_not_merged", layout(a) == "2048f 2048f ", layout(a));
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
  return failures ? 1 : 0;
}
