#version 450
// Reference kernel: a ping-pong actor (src/vkmulti/kernels/reference.py), for
// latency. Payload word 0 of a message is the number of hops still to go:
// while it is above 0 the actor sends the message on (payload kept, word 0
// minus one, tag PING) to its partner params.x, or back to the sender when
// params.x is 0; at 0 it hands the message to the host (tag DONE).
#extension GL_GOOGLE_include_directive : require
#include "vkm_kernel_abi.glsl"

layout(local_size_x = 1) in;

layout(std430, set = 0, binding = 2) buffer State {
    uint bounces; uint done; uint failed_emits; uint last_remaining;
} st;

#define TAG_PING 1u
#define TAG_DONE 2u

void main()
{
    uint n = vkm_inbox_count();
    for (uint i = 0u; i < n; i++) {
        uint m = vkm_in(i);
        uint remaining = vkm_in_payload(m, 0u);
        uint len = vkm_in_field(m, VKM_LEN);
        uint partner = vkm_step.params.x != 0u ? vkm_step.params.x : vkm_in_field(m, VKM_SRC);
        bool finished = remaining == 0u;
        uint o = vkm_emit(finished ? VKM_HOST : partner, finished ? TAG_DONE : TAG_PING, len);
        st.bounces += 1u;
        st.last_remaining = remaining;
        if (o == VKM_FULL) {
            st.failed_emits += 1u;
            continue;
        }
        if (finished)
            st.done += 1u;
        uint words = (len + 3u) / 4u;
        for (uint w = 0u; w < words; w++)
            vkm_set_payload(o, w, vkm_in_payload(m, w));
        vkm_set_payload(o, 0u, finished ? 0u : remaining - 1u);
    }
}
