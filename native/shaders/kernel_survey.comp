#version 450
// The runtime's survey of a message batch (src/vkmulti/kernels/runtime.py):
// which kernels of this device, which other devices and how many unknown
// addresses and host messages it holds, looked up in the runtime's directory.
// The host reads the record to know when the batch is fully delivered, and
// the lowest and highest destination address in it (equal: one destination,
// which the K2K router takes as a hint for the sender's next batches).
#extension GL_GOOGLE_include_directive : require
#define VKM_RUNTIME_PASS
#include "vkm_kernel_abi.glsl"

layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) readonly buffer Batch {
    uint count; uint step_lo; uint capacity; uint slot_words; uint pad[12]; uint words[];
} batch;
// at address % table_size: (address, device index + 1, local slot, tenant); (0, 0, 0, 0) when free
layout(std430, set = 0, binding = 1) readonly buffer Directory { uvec4 entries[]; } dir;
layout(std430, set = 0, binding = 2) buffer Status { uint words[]; } status;
layout(push_constant) uniform Params { uint status_offset; uint device; uint table_size; uint pad; } pc;

#include "vkm_survey.glsl"

shared uint s_n;

void main()
{
    uint t = gl_LocalInvocationID.x;
    vkm_survey_begin(t);
    if (t == 0u)
        s_n = min(batch.count, batch.capacity);
    VKM_SYNC();
    uint words = batch.slot_words;
    for (uint i = t; i < s_n; i += 64u)
        vkm_survey_add(batch.words[i * words + VKM_DST], pc.table_size, pc.device);
    VKM_SYNC();
    vkm_survey_write(t, pc.status_offset, s_n);
}
