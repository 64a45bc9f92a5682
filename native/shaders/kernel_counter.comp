#version 450
// Reference kernel: a counter/accumulator actor (src/vkmulti/kernels/reference.py).
// Consumes its inbox in order, one invocation. Every message counts; tag ADD
// (1) adds payload word 0 to a 64-bit sum; QUERY (2) replies to its sender
// with REPLY (3): count, sum, FIFO errors, step, query word 0; FORWARD (4)
// adds and sends word 0 on to params.x as ADD. For each sender it checks that
// sequence numbers arrive 0, 1, 2, ... and counts every gap or repeat. It also
// sums the hop counts of what it consumed (device crossings, set by the K2K
// router) and keeps the largest.
#extension GL_GOOGLE_include_directive : require
#include "vkm_kernel_abi.glsl"

layout(local_size_x = 1) in;

layout(std430, set = 0, binding = 2) buffer State {
    uint count; uint sum_lo; uint sum_hi; uint fifo_errors;
    uint queries; uint forwards; uint failed_emits; uint table_size;
    uint hops_sum; uint max_hops; uint pad[6];
    uvec4 expected[];   // at source % table_size: (source address, next sequence lo, hi, 0)
} st;

#define TAG_ADD 1u
#define TAG_QUERY 2u
#define TAG_REPLY 3u
#define TAG_FORWARD 4u

void main()
{
    uint n = vkm_inbox_count();
    for (uint i = 0u; i < n; i++) {
        uint m = vkm_in(i);
        uint src = vkm_in_field(m, VKM_SRC);
        uint tag = vkm_in_field(m, VKM_TAG);
        uint value = vkm_in_payload(m, 0u);
        uvec2 seq = uvec2(vkm_in_field(m, VKM_SEQ_LO), vkm_in_field(m, VKM_SEQ_HI));
        uint idx = src % st.table_size;
        uvec4 e = st.expected[idx];
        uvec2 want = e.x == src ? e.yz : uvec2(0u);
        if (seq != want)
            st.fifo_errors += 1u;
        uint carry;
        uint next_lo = uaddCarry(seq.x, 1u, carry);
        st.expected[idx] = uvec4(src, next_lo, seq.y + carry, 0u);

        st.count += 1u;
        uint hops = vkm_in_field(m, VKM_HOPS);
        st.hops_sum += hops;
        st.max_hops = max(st.max_hops, hops);
        if (tag == TAG_QUERY) {
            st.queries += 1u;
            uint r = vkm_emit(src, TAG_REPLY, 24u);
            if (r == VKM_FULL) {
                st.failed_emits += 1u;
            } else {
                vkm_set_payload(r, 0u, st.count);
                vkm_set_payload(r, 1u, st.sum_lo);
                vkm_set_payload(r, 2u, st.sum_hi);
                vkm_set_payload(r, 3u, st.fifo_errors);
                vkm_set_payload(r, 4u, vkm_step.step_lo);
                vkm_set_payload(r, 5u, value);
            }
            continue;
        }
        uint c;
        st.sum_lo = uaddCarry(st.sum_lo, value, c);
        st.sum_hi += c;
        if (tag == TAG_FORWARD) {
            st.forwards += 1u;
            uint f = vkm_emit(vkm_step.params.x, TAG_ADD, 4u);
            if (f == VKM_FULL)
                st.failed_emits += 1u;
            else
                vkm_set_payload(f, 0u, value);
        }
    }
}
