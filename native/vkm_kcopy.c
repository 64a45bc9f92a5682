/* vkm_kcopy.c - see vkm_kcopy.h. */
#include "vkm_kcopy.h"
#include "vkm_ring.h"

#include <stdlib.h>
#include <string.h>

#include "vkm_kcopy_spv.h"

enum { K_BUFFER, K_TO_BUFFER_4, K_TO_BUFFER_8, K_TO_BUFFER_16, K_TO_IMAGE_4, K_TO_IMAGE_8, K_TO_IMAGE_16, K_COUNT };

static const struct {
    const uint32_t *code;
    size_t size;
} kernels[K_COUNT] = {
    {vkm_spv_copy_buffer, sizeof vkm_spv_copy_buffer},
    {vkm_spv_image_to_buffer_4, sizeof vkm_spv_image_to_buffer_4},
    {vkm_spv_image_to_buffer_8, sizeof vkm_spv_image_to_buffer_8},
    {vkm_spv_image_to_buffer_16, sizeof vkm_spv_image_to_buffer_16},
    {vkm_spv_buffer_to_image_4, sizeof vkm_spv_buffer_to_image_4},
    {vkm_spv_buffer_to_image_8, sizeof vkm_spv_buffer_to_image_8},
    {vkm_spv_buffer_to_image_16, sizeof vkm_spv_buffer_to_image_16},
};

/* Each kind of kernel has its own set layout, binding 0 the source and 1 the
 * destination, so a bound set never holds a stale descriptor of another kind. */
enum { KIND_BUFFER, KIND_TO_BUFFER, KIND_TO_IMAGE, KIND_COUNT };

static int kind_of(int kernel)
{
    return kernel == K_BUFFER ? KIND_BUFFER : kernel <= K_TO_BUFFER_16 ? KIND_TO_BUFFER : KIND_TO_IMAGE;
}

struct vkm_kcopy {
    const vkm_device *dev;
    VkDescriptorSetLayout set_layouts[KIND_COUNT];
    VkPipelineLayout layouts[KIND_COUNT];
    VkPipeline pipes[K_COUNT];
    VkDescriptorPool pool;
    VkDescriptorSet *sets[KIND_COUNT]; /* nsets each */
    uint32_t nsets;
};

typedef struct push {
    uint32_t a, b, c, d;
} push;

#define TRY VKM_TRY

static VkResult build(vkm_kcopy *k, uint32_t sets, vkm_error *err)
{
    const vkm_device *d = k->dev;
    const VkDescriptorType SB = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, SI = VK_DESCRIPTOR_TYPE_STORAGE_IMAGE;
    const VkDescriptorType types[KIND_COUNT][2] = {{SB, SB}, {SI, SB}, {SB, SI}};
    VkPushConstantRange pc = {VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(push)};
    for (int t = 0; t < KIND_COUNT; t++) {
        VkDescriptorSetLayoutBinding b[2] = {
            {0, types[t][0], 1, VK_SHADER_STAGE_COMPUTE_BIT, NULL},
            {1, types[t][1], 1, VK_SHADER_STAGE_COMPUTE_BIT, NULL},
        };
        VkDescriptorSetLayoutCreateInfo li = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                                              .bindingCount = 2,
                                              .pBindings = b};
        TRY(d->fn.vkCreateDescriptorSetLayout(d->device, &li, NULL, &k->set_layouts[t]),
            "vkCreateDescriptorSetLayout");
        VkPipelineLayoutCreateInfo pli = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                          .setLayoutCount = 1,
                                          .pSetLayouts = &k->set_layouts[t],
                                          .pushConstantRangeCount = 1,
                                          .pPushConstantRanges = &pc};
        TRY(d->fn.vkCreatePipelineLayout(d->device, &pli, NULL, &k->layouts[t]), "vkCreatePipelineLayout");
    }
    for (int i = 0; i < K_COUNT; i++) {
        VkShaderModuleCreateInfo mi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                       .codeSize = kernels[i].size,
                                       .pCode = kernels[i].code};
        VkShaderModule m;
        TRY(d->fn.vkCreateShaderModule(d->device, &mi, NULL, &m), "vkCreateShaderModule(copy kernel)");
        VkComputePipelineCreateInfo ci = {
            .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
            .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                      .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                      .module = m,
                      .pName = "main"},
            .layout = k->layouts[kind_of(i)],
        };
        VkResult r = d->fn.vkCreateComputePipelines(d->device, VK_NULL_HANDLE, 1, &ci, NULL, &k->pipes[i]);
        d->fn.vkDestroyShaderModule(d->device, m, NULL);
        if (r != VK_SUCCESS) {
            k->pipes[i] = VK_NULL_HANDLE;
            return vkm_fail(err, r, "vkCreateComputePipelines(copy kernel)", NULL);
        }
    }
    VkDescriptorPoolSize sizes[2] = {{SB, 4 * sets}, {SI, 2 * sets}};
    VkDescriptorPoolCreateInfo dpi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                                      .maxSets = KIND_COUNT * sets,
                                      .poolSizeCount = 2,
                                      .pPoolSizes = sizes};
    TRY(d->fn.vkCreateDescriptorPool(d->device, &dpi, NULL, &k->pool), "vkCreateDescriptorPool");
    VkDescriptorSetLayout *layouts = malloc(sizeof(VkDescriptorSetLayout) * sets);
    if (!layouts) return vkm_fail(err, VK_ERROR_OUT_OF_HOST_MEMORY, "malloc(descriptor sets)", NULL);
    VkResult r = VK_SUCCESS;
    for (int t = 0; t < KIND_COUNT && r == VK_SUCCESS; t++) {
        k->sets[t] = calloc(sets, sizeof(VkDescriptorSet));
        if (!k->sets[t]) {
            r = VK_ERROR_OUT_OF_HOST_MEMORY;
            break;
        }
        for (uint32_t i = 0; i < sets; i++) layouts[i] = k->set_layouts[t];
        VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                          .descriptorPool = k->pool,
                                          .descriptorSetCount = sets,
                                          .pSetLayouts = layouts};
        r = d->fn.vkAllocateDescriptorSets(d->device, &ai, k->sets[t]);
    }
    free(layouts);
    if (r != VK_SUCCESS) return vkm_fail(err, r, "vkAllocateDescriptorSets", NULL);
    k->nsets = sets;
    return VK_SUCCESS;
}

VkResult vkm_kcopy_create(const vkm_device *d, uint32_t family, uint32_t sets, vkm_kcopy **out, vkm_error *err)
{
    *out = NULL;
    uint32_t n = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(d->physical, &n, NULL);
    VkQueueFamilyProperties *fp = calloc(n ? n : 1, sizeof *fp);
    if (!fp) return VK_ERROR_OUT_OF_HOST_MEMORY;
    vkGetPhysicalDeviceQueueFamilyProperties(d->physical, &n, fp);
    int compute = family < n && (fp[family].queueFlags & VK_QUEUE_COMPUTE_BIT);
    free(fp);
    if (!compute || !sets)
        return vkm_fail(err, VKM_ERROR_UNSUPPORTED, "vkm_kcopy_create", "queue family %u of '%s' has no compute",
                        family, d->name);
    vkm_kcopy *k = calloc(1, sizeof *k);
    if (!k) return VK_ERROR_OUT_OF_HOST_MEMORY;
    k->dev = d;
    VkResult r = build(k, sets, err);
    if (r != VK_SUCCESS) {
        vkm_kcopy_destroy(k);
        return r;
    }
    *out = k;
    return VK_SUCCESS;
}

void vkm_kcopy_destroy(vkm_kcopy *k)
{
    if (!k) return;
    const vkm_device *d = k->dev;
    if (k->pool) d->fn.vkDestroyDescriptorPool(d->device, k->pool, NULL); /* frees the sets */
    for (int i = 0; i < K_COUNT; i++)
        if (k->pipes[i]) d->fn.vkDestroyPipeline(d->device, k->pipes[i], NULL);
    for (int t = 0; t < KIND_COUNT; t++) {
        if (k->layouts[t]) d->fn.vkDestroyPipelineLayout(d->device, k->layouts[t], NULL);
        if (k->set_layouts[t]) d->fn.vkDestroyDescriptorSetLayout(d->device, k->set_layouts[t], NULL);
        free(k->sets[t]);
    }
    free(k);
}

static VkFormat view_format(uint32_t bytes_per_pixel)
{
    switch (bytes_per_pixel) {
    case 4: return VK_FORMAT_R32_UINT;
    case 8: return VK_FORMAT_R32G32_UINT;
    case 16: return VK_FORMAT_R32G32B32A32_UINT;
    default: return VK_FORMAT_UNDEFINED;
    }
}

int vkm_kcopy_serves(const vkm_kcopy *k, const vkm_endpoint *e, VkDeviceSize max_chunk)
{
    if (!k || !e->kernel || max_chunk + 256 > k->dev->limits.maxStorageBufferRange) return 0;
    if (!e->image) return 1;
    VkFormat f = view_format(e->bytes_per_pixel);
    return f != VK_FORMAT_UNDEFINED && e->kernel == (uint32_t)f && e->kernel_view != VK_NULL_HANDLE;
}

static uint32_t groups(VkDeviceSize n, uint32_t per_group, uint32_t max)
{
    VkDeviceSize g = (n + per_group - 1) / per_group;
    return g > max ? max : (uint32_t)(g ? g : 1);
}

VkDeviceSize vkm_kcopy_record(vkm_kcopy *k, VkCommandBuffer cmd, uint32_t set, const vkm_endpoint *e,
                              VkBuffer ring, VkDeviceSize ring_offset, VkDeviceSize start, VkDeviceSize len,
                              int to_ring)
{
    const vkm_device *d = k->dev;
    const VkPhysicalDeviceLimits *lim = &d->limits;
    VkDescriptorBufferInfo bufs[2];
    VkDescriptorImageInfo img = {VK_NULL_HANDLE, e->kernel_view, VKM_KCOPY_IMAGE_LAYOUT};
    VkWriteDescriptorSet w[2];
    memset(w, 0, sizeof w);
    for (int i = 0; i < 2; i++) {
        w[i].sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
        w[i].dstBinding = (uint32_t)i; /* 0: source, 1: destination */
        w[i].descriptorCount = 1;
    }
    push p = {0, 0, 0, 0};
    int kernel;
    uint32_t gx, gy = 1;
    if (e->image) {
        VkDeviceSize row = (VkDeviceSize)e->width * e->bytes_per_pixel;
        uint32_t size_index = e->bytes_per_pixel == 4 ? 0 : e->bytes_per_pixel == 8 ? 1 : 2;
        kernel = (to_ring ? K_TO_BUFFER_4 : K_TO_IMAGE_4) + (int)size_index;
        bufs[0] = (VkDescriptorBufferInfo){ring, ring_offset, len};
        int ib = to_ring ? 0 : 1; /* the image's binding; the ring's is the other */
        w[ib].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_IMAGE;
        w[ib].pImageInfo = &img;
        w[1 - ib].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        w[1 - ib].pBufferInfo = &bufs[0];
        p = (push){0, (uint32_t)(start / row), (uint32_t)(len / row), e->width};
        gx = groups(e->width, 64, lim->maxComputeWorkGroupCount[0]);
        gy = groups(p.c, 4, lim->maxComputeWorkGroupCount[1]);
    } else {
        VkDeviceSize at = e->offset + start, body = len & ~(VkDeviceSize)15;
        VkDeviceSize align = lim->minStorageBufferOffsetAlignment ? lim->minStorageBufferOffsetAlignment : 16;
        VkDeviceSize base = at / align * align, rbase = ring_offset / align * align;
        if (at % 16 || ring_offset % 16 || !body || at - base + body > lim->maxStorageBufferRange ||
            ring_offset - rbase + body > lim->maxStorageBufferRange || body / 16 > UINT32_MAX) {
            vkm_record_chunk(d, cmd, e, ring, ring_offset, start, len, to_ring);
            return 0;
        }
        kernel = K_BUFFER;
        VkDescriptorBufferInfo ep = {e->buffer, base, at - base + body};
        VkDescriptorBufferInfo rg = {ring, rbase, ring_offset - rbase + body};
        bufs[0] = to_ring ? ep : rg; /* source */
        bufs[1] = to_ring ? rg : ep; /* destination */
        for (int i = 0; i < 2; i++) {
            w[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
            w[i].pBufferInfo = &bufs[i];
        }
        p = (push){(uint32_t)((to_ring ? at - base : ring_offset - rbase) / 16),
                   (uint32_t)((to_ring ? ring_offset - rbase : at - base) / 16), (uint32_t)(body / 16), 0};
        gx = groups(p.c, 256, lim->maxComputeWorkGroupCount[0] < 65535 ? lim->maxComputeWorkGroupCount[0] : 65535);
        if (body < len) /* the last few bytes */
            vkm_record_chunk(d, cmd, e, ring, ring_offset + body, start + body, len - body, to_ring);
        len = body;
    }
    int kind = kind_of(kernel);
    VkDescriptorSet ds = k->sets[kind][set % k->nsets];
    w[0].dstSet = w[1].dstSet = ds;
    d->fn.vkUpdateDescriptorSets(d->device, 2, w, 0, NULL);
    d->fn.vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, k->pipes[kernel]);
    d->fn.vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, k->layouts[kind], 0, 1, &ds, 0, NULL);
    d->fn.vkCmdPushConstants(cmd, k->layouts[kind], VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof p, &p);
    d->fn.vkCmdDispatch(cmd, gx, gy, 1);
    return len;
}
