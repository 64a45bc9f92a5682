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

#define MASK_WORDS 8u

shared uint s_mask[MASK_WORDS];
shared uint s_devices;
shared uint s_local;
shared uint s_remote;
shared uint s_host;
shared uint s_unknown;
shared uint s_n;
shared uint s_min;
shared uint s_max;

void main()
{
    uint t = gl_LocalInvocationID.x;
    if (t < MASK_WORDS)
        s_mask[t] = 0u;
    if (t == 0u) {
        s_devices = 0u; s_local = 0u; s_remote = 0u; s_host = 0u; s_unknown = 0u;
        s_n = min(batch.count, batch.capacity);
        s_min = 0xffffffffu; s_max = 0u;
    }
    VKM_SYNC();
    uint words = batch.slot_words;
    for (uint i = t; i < s_n; i += 64u) {
        uint dest = batch.words[i * words + VKM_DST];
        atomicMin(s_min, dest);
        atomicMax(s_max, dest);
        if (dest == VKM_HOST) {
            atomicAdd(s_host, 1u);
            continue;
        }
        uvec4 e = dir.entries[dest % pc.table_size];
        if (e.x != dest || e.y == 0u) {
            atomicAdd(s_unknown, 1u);
        } else if (e.y - 1u == pc.device) {
            atomicOr(s_mask[(e.z / 32u) % MASK_WORDS], 1u << (e.z % 32u));
            atomicAdd(s_local, 1u);
        } else {
            atomicOr(s_devices, 1u << ((e.y - 1u) % 32u));
            atomicAdd(s_remote, 1u);
        }
    }
    VKM_SYNC();
    uint o = pc.status_offset;
    if (t < MASK_WORDS)
        status.words[o + t] = s_mask[t];
    if (t == 0u) {
        status.words[o + 8u] = s_devices;
        status.words[o + 9u] = s_local;
        status.words[o + 10u] = s_remote;
        status.words[o + 11u] = s_host;
        status.words[o + 12u] = s_unknown;
        status.words[o + 13u] = s_n;
        status.words[o + 14u] = s_min;
        status.words[o + 15u] = s_max;
    }
}
