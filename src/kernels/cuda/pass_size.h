// How many of an expert's items one pass over its weights serves, for the routed-expert kernels
// compiled for a few such sizes (moe_w2.cu: 2, 4 or 8 items; moe.cu's MXFP4 path: 1 to 8). A
// larger pass reads an expert's weights fewer times but does more arithmetic per weight, for
// every pass, whether or not its items fill it; which size is faster depends on how many items
// the active experts get. Host code: the choice depends only on the shapes, so a captured graph
// keeps it.
#pragma once

#include <cstdint>

namespace moet::cuda {

struct PassSize {
  int items;    // items one pass serves
  double cost;  // measured time of one pass relative to the other options
};

// The option with the least expected time for a batch of `rows` whose rows each send an item to
// top_k of `experts` uniformly at random: an expert's item count n is Binomial(rows, top_k /
// experts) and it takes ceil(n / items) passes, the later ones cheaper (pass_size.cu). Options in
// ascending size; ties go to the smaller. With 32 or more items per expert on average the largest
// option is taken.
int best_pass_items(int64_t rows, int64_t top_k, int64_t experts, const PassSize* options, int count);

}  // namespace moet::cuda
