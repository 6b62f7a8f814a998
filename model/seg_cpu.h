/* seg_cpu.h - the CPU forward of a tw_segnet with oneDNN (fp32).
 *
 * Every op of the graph becomes one oneDNN primitive planned for ONE tile
 * (direct convolutions, no Winograd); a batch runs tile after tile through
 * the same primitives, so a tile's bits never depend on the batch size.
 * Activations are in the 16-channel blocked layout (nChw16c), the input
 * tile in NCHW. BN is folded (model/segnet.c); ReLU is a post-op; the
 * residual add is a sum post-op into the shortcut's storage. A
 * concatenation costs no copy: each of its inputs is written by its own op
 * straight into its channel range of the concatenated buffer (a run of
 * whole 16-channel blocks is a dense nChw16c map of its own); only an
 * input whose channels are not a multiple of 16 (and is not the last) is
 * copied there. Activations share one arena: a value's storage is reused
 * once its last reader ran (first-fit by size over lifetimes).
 */
#ifndef TW_SEG_CPU_H
#define TW_SEG_CPU_H

#include <stddef.h>

#include "model/segnet.h"
#include "core/error.h"

typedef struct tw_seg_cpu tw_seg_cpu;

/* Build the forward of net for tiles of tile x tile pixels: primitives,
 * weights in oneDNN's layouts, the activation arena and one scratchpad.
 * net must outlive the result (its shapes are read; the weights are
 * copied). TW_ERR_CONFIG for a tile the net cannot take (see
 * tw_segnet_shapes), TW_ERR_NOMEM, TW_ERR_INTERNAL for oneDNN failures. */
tw_status tw_seg_cpu_create(const tw_segnet *net, int tile, tw_seg_cpu **out, tw_error *err);

/* Run n tiles: in [n][in_bands][tile][tile] (NCHW float), probs
 * [n][n_classes][tile][tile] (softmax over classes at every pixel). Tiles
 * run one at a time through the same primitives (batch-independent bits).
 * Allocates nothing. Not thread-safe on one c. */
tw_status tw_seg_cpu_run(tw_seg_cpu *c, const float *in, int n, float *probs, tw_error *err);

/* Bytes c holds: activation arena, scratchpad and reordered weights. */
size_t tw_seg_cpu_bytes(const tw_seg_cpu *c);

/* The copies c makes per tile: inputs of a concatenation that could not
 * be written in place (*concat) and shortcuts copied before a residual
 * conv's sum (*residual). Cannot fail. */
void tw_seg_cpu_copies(const tw_seg_cpu *c, int *concat, int *residual);

/* Release; accepts NULL. */
void tw_seg_cpu_destroy(tw_seg_cpu *c);

/* The activation bytes a batch of n tiles of tile px needs on the CPU,
 * without building anything: the arena (the most values alive at once,
 * shared by the tiles as they run one after another, so independent of n)
 * plus n tiles' input and probabilities. The scratchpad and the weights
 * are not included (tw_seg_cpu_bytes has them once built). TW_ERR_CONFIG as
 * tw_segnet_shapes; TW_ERR_NOMEM. *arena (may be NULL): the arena alone. */
tw_status tw_seg_cpu_batch_bytes(const tw_segnet *net, int tile, int n, size_t *bytes,
                                 size_t *arena, tw_error *err);

#endif
