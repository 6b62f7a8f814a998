/* info_seg.c - `tilewise info` about a segmentation model file (model/
 * segnet.h: FCN, DeepLabV3, U-Net with a ResNet encoder): the facts as a
 * jansson tree (info_internal.h) and their text. The task, the network, the
 * output (a class per pixel of the tile), the encoder's output stride and
 * the tile sides the network takes. */
#include <math.h>
#include <string.h>

#include "api/info_internal.h"
#include "io/modelfile/model_file.h"
#include "model/segnet.h"

/* The encoder's output stride: torchvision's segmentation backbones trade
 * layer3/layer4's strides for dilation (8); SMP's U-Net encoder keeps them
 * (32) and its decoder climbs back to the tile. */
static int encoder_output_stride(const tw_segnet *net)
{
    return net->kind == TW_SEG_UNET ? 32 : 8;
}

static const char *kind_name(const tw_segnet *net)
{
    return net->kind == TW_SEG_UNET  ? "U-Net (segmentation_models_pytorch)"
           : net->kind == TW_SEG_FCN ? "FCN (torchvision)"
                                     : "DeepLabV3 (torchvision)";
}

json_t *tw_info_seg_facts(const char *path, const tw_model_file *mf, const tw_segnet *net, bool *ok)
{
    long long params = 0;
    for (int i = 0; i < mf->n_tensors; i++)
        if (!strstr(mf->tensors[i].name, "running_") &&
            !strstr(mf->tensors[i].name, "num_batches") &&
            strncmp(mf->tensors[i].name, "aux_classifier.", 15) != 0)
            params += mf->tensors[i].numel;
    json_t *f = json_object(), *classes = json_array(), *bands = json_array(), *mean = json_array(),
           *std = json_array();
    tw_info_put(f, "type", json_string("model"), ok);
    tw_info_put(f, "path", tw_info_str(path), ok);
    tw_info_put(f, "task", json_string("segmentation"), ok);
    tw_info_put(f, "arch", tw_info_str(net->arch), ok);
    tw_info_put(f, "network", tw_info_str(kind_name(net)), ok);
    tw_info_put(f, "encoder_depth", json_integer(net->depth), ok);
    tw_info_put(f, "encoder_output_stride", json_integer(encoder_output_stride(net)), ok);
    tw_info_put(f, "output", json_string("per pixel"), ok);
    tw_info_put(f, "tile_multiple", json_integer(net->multiple), ok);
    tw_info_put(f, "in_bands", json_integer(net->in_bands), ok);
    for (int i = 0; i < mf->n_bands; i++) tw_info_push(bands, json_integer(mf->bands[i]), ok);
    tw_info_put(f, "bands", bands, ok);
    tw_info_put(f, "n_classes", json_integer(net->n_classes), ok);
    for (int i = 0; i < mf->n_classes; i++) tw_info_push(classes, tw_info_str(mf->classes[i]), ok);
    tw_info_put(f, "classes", classes, ok);
    tw_info_put(f, "parameters", json_integer(params), ok);
    tw_info_put(f, "scale", tw_info_num(mf->scale), ok);
    for (int i = 0; i < mf->n_mean; i++) tw_info_push(mean, tw_info_num(mf->mean[i]), ok);
    for (int i = 0; i < mf->n_std; i++) tw_info_push(std, tw_info_num(mf->std[i]), ok);
    tw_info_put(f, "mean", mean, ok);
    tw_info_put(f, "std", std, ok);
    tw_info_put(f, "tile", mf->tile ? json_integer(mf->tile) : json_null(), ok);
    tw_info_put(f, "sha256", tw_info_str(mf->sha256), ok);
    tw_info_put(f, "checksum", tw_info_str(tw_model_checksum_name(mf->checksum)), ok);
    return f;
}

void tw_info_seg_text(const json_t *f, FILE *out)
{
    json_t *v;
    size_t i;
    fprintf(out, "model:      %s\n", tw_info_get_str(f, "path"));
    fprintf(out, "task:       segmentation (a class per pixel; tiles blended: tiling.blend)\n");
    fprintf(out, "arch:       %s, %s, ResNet-%lld encoder\n", tw_info_get_str(f, "arch"),
            tw_info_get_str(f, "network"), tw_info_get_int(f, "encoder_depth"));
    long long os = tw_info_get_int(f, "encoder_output_stride"),
              mult = tw_info_get_int(f, "tile_multiple");
    fprintf(out, "output:     per pixel of the tile (the encoder's output stride %lld, %s)\n", os,
            mult > 1 ? "the decoder climbs back to the tile" : "resized bilinearly to the tile");
    if (mult > 1)
        fprintf(out, "tiles:      sides a multiple of %lld px (32 at least)\n", mult);
    else
        fprintf(out, "tiles:      any side of 32 px or more\n");
    json_t *bands = json_object_get(f, "bands");
    fprintf(out, "bands:      %lld", tw_info_get_int(f, "in_bands"));
    if (json_array_size(bands)) {
        fprintf(out, " (raster bands");
        json_array_foreach(bands, i, v) fprintf(out, " %lld", (long long)json_integer_value(v));
        fprintf(out, ")");
    }
    json_t *classes = json_object_get(f, "classes");
    fprintf(out, "\nclasses:    %lld", tw_info_get_int(f, "n_classes"));
    json_array_foreach(classes, i, v) fprintf(out, "%s%s", i ? ", " : " (", json_string_value(v));
    fprintf(out, "%s\n", json_array_size(classes) ? ")" : "");
    fprintf(out, "parameters: %lld\n", tw_info_get_int(f, "parameters"));
    tw_info_norm_text(f, out);
    fprintf(out, "checksum:   %s\n", tw_info_get_str(f, "checksum"));
}
