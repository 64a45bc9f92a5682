#version 450
// Reference kernel: a burst sender and a checking sink, for K2K bandwidth
// (src/vkmulti/kernels/reference.py, bench/k2k.py). Workgroup g of the step's
// G workgroups handles message slots g, g + G, ... (64 invocations share the
// words of a full payload; restamps and checks take one invocation each):
//  - as a sender (params.x = destination address, params.y = messages per
//    step), it fills outbox slot i with a full payload: word w of message i
//    of step s is s * 65599 + i * 131 + w (words 0 and 1: s and i). With
//    params.z set, steps from params.w on only restamp the words the sink
//    checks (0, 1, the middle and the last one) and leave the rest as an
//    earlier step wrote it (a sender whose payloads are ready: the bandwidth
//    bench measures moving messages, not making them; launch with params.w
//    = the runtime's in_flight so that every outbox region was written once);
//  - as a receiver, it checks inbox message i (if this step has one): its
//    first and last payload words must follow the pattern of its own step and
//    slot (carried in payload words 0 and 1), and counts it and its bytes.
// A kernel can do both in one step.
#extension GL_GOOGLE_include_directive : require
#include "vkm_kernel_abi.glsl"

layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 2) buffer State {
    uint received; uint bad; uint bytes_lo; uint bytes_hi; uint sent_steps; uint pad[11];
} st;

// the outbox again as 16-byte vectors (the 16-word header is 4 of them)
layout(std430, set = 0, binding = 1) buffer Outbox4 { uvec4 v[]; } out4;

#define TAG_BURST 7u

uint pattern(uint s, uint i, uint w) { return s * 65599u + i * 131u + w; }

void main()
{
    uint g = gl_WorkGroupID.x;
    uint groups = gl_NumWorkGroups.x;
    uint t = gl_LocalInvocationID.x;
    uint pw = vkm_step.payload_words;
    uint dest = vkm_step.params.x;
    uint n = min(vkm_step.params.y, vkm_step.outbox_capacity);
    uint s = vkm_step.step_lo;

    bool restamp = vkm_step.params.z != 0u && s >= vkm_step.params.w && pw >= 3u;
    if (dest != 0u && restamp) {
        for (uint i = g + groups * t; i < n; i += groups * 64u) {
            uint m = vkm_emit_at(i, dest, TAG_BURST, pw * 4u);
            vkm_set_payload(m, 0u, s);
            vkm_set_payload(m, 1u, i);
            vkm_set_payload(m, pw / 2u, pattern(s, i, pw / 2u));
            vkm_set_payload(m, pw - 1u, pattern(s, i, pw - 1u));
        }
    } else if (dest != 0u) {
        for (uint i = g; i < n; i += groups) {
            uint m = i * vkm_outbox.slot_words;
            if (t == 0u)
                vkm_emit_at(i, dest, TAG_BURST, pw * 4u);
            // 16 bytes per store (payloads are multiples of 16 bytes, slots start 16-byte aligned)
            uint base = (16u + m + VKM_ENV_WORDS) / 4u;
            for (uint v = t; v < pw / 4u; v += 64u) {
                uint w = v * 4u;
                uvec4 x = uvec4(pattern(s, i, w), pattern(s, i, w + 1u), pattern(s, i, w + 2u),
                                pattern(s, i, w + 3u));
                if (v == 0u)
                    x.xy = uvec2(s, i);
                out4.v[base + v] = x;
            }
        }
    }
    if (dest != 0u && n > 0u && g == 0u && t == 0u) {
        vkm_outbox_set_count(n);
        st.sent_steps += 1u;
    }

    uint count = vkm_inbox_count();
    for (uint i = g + groups * t; i < count; i += groups * 64u) {
        uint m = vkm_in(i);
        uint len = vkm_in_field(m, VKM_LEN);
        uint words = len / 4u;
        uint ms = vkm_in_payload(m, 0u), mi = vkm_in_payload(m, 1u);
        bool ok = words >= 3u && vkm_in_payload(m, words - 1u) == pattern(ms, mi, words - 1u)
                  && vkm_in_payload(m, words / 2u) == pattern(ms, mi, words / 2u);
        atomicAdd(st.received, 1u);
        if (!ok)
            atomicAdd(st.bad, 1u);
        uint lo = atomicAdd(st.bytes_lo, len);
        if (lo + len < lo)
            atomicAdd(st.bytes_hi, 1u);
    }
}
