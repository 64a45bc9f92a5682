#version 450
// The copy half of a planned delivery (src/vkmulti/kernels/stepper.py): after
// kernel_deliver.comp ran with `plan` set, workgroup i copies batch messages i, i + G, ...
// into the inbox slot the plan stored in its flags (bits 16-31), all 64
// invocations on its words (16 bytes at a time: slots are multiples of 16
// bytes), so large messages move at the device's copy speed instead of one
// invocation per message. Messages not planned for this kernel are left
// alone. Same bindings and push constants as kernel_deliver.comp.
#extension GL_GOOGLE_include_directive : require
#define VKM_RUNTIME_PASS
#include "vkm_kernel_abi.glsl"

layout(local_size_x = 64) in;

// the 16-word headers are the first 4 vectors: (count, step, capacity, slot words), (head, tail, capacity, ...)
layout(std430, set = 0, binding = 0) buffer Batch { uvec4 v[]; } batch;
layout(std430, set = 0, binding = 1) buffer Inbox { uvec4 v[]; } inbox;
layout(push_constant) uniform Params {
    uint self_address; uint tenant; uint status_offset; uint hops; uint plan; uint pad0; uint pad1; uint pad2;
} pc;

#define HEADER_VECS 4u

void main()
{
    uint t = gl_LocalInvocationID.x;
    uvec4 head = batch.v[0];
    uint n = min(head.x, head.z);
    uint vecs = head.w / 4u;                              // 16-byte vectors per slot
    for (uint i = gl_WorkGroupID.x; i < n; i += gl_NumWorkGroups.x) {
        uint m = HEADER_VECS + i * vecs;
        uvec4 env2 = batch.v[m + 2u];                     // envelope words 8-11: tag, tenant, hops, flags
        uint flags = env2.w;
        if ((flags & VKM_FLAG_COPY) == 0u || batch.v[m].y != pc.self_address)
            continue;                                     // (the same for the whole workgroup)
        uint d = HEADER_VECS + (flags >> 16u) * vecs;
        for (uint w = t; w < vecs; w += 64u)
            inbox.v[d + w] = batch.v[m + w];
        memoryBarrierBuffer();
        barrier();
        if (t == 0u) {
            inbox.v[d + 2u] = uvec4(env2.x, env2.y, env2.z + pc.hops, flags & VKM_FLAG_PRIORITY_MASK);
            batch.v[m + 2u].w = (flags & VKM_FLAG_PRIORITY_MASK) | VKM_FLAG_DELIVERED;
        }
    }
}
