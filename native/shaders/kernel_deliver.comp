#version 450
// The runtime's delivery pass (src/vkmulti/kernels/runtime.py): appends, in
// batch order, the messages of a batch addressed to one kernel to that
// kernel's inbox, as many as its ring has room for. Each delivered message
// is flagged in the batch (it is never delivered twice); the rest stay for a
// later step (back-pressure, never a drop). A message from another tenant is
// flagged too and counted as rejected. The counts go to the host-visible
// status record at `status_offset`. `hops` is added to each delivered
// message's hop count (the K2K router's device crossings for this batch).
// With `plan` set the pass copies nothing: it marks each message it takes
// with VKM_FLAG_COPY and its inbox slot, and kernel_deliver_copy.comp (one
// workgroup per message, all invocations on its words) copies them; the
// runtime does that for large messages.
#extension GL_GOOGLE_include_directive : require
#define VKM_RUNTIME_PASS
#include "vkm_kernel_abi.glsl"

layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) buffer Batch {
    uint count; uint step_lo; uint capacity; uint slot_words; uint pad[12]; uint words[];
} batch;
layout(std430, set = 0, binding = 1) buffer Inbox {
    uint head; uint tail; uint capacity; uint slot_words; uint pad[12]; uint words[];
} inbox;
layout(std430, set = 0, binding = 2) buffer Status { uint words[]; } status;
layout(push_constant) uniform Params {
    uint self_address; uint tenant; uint status_offset; uint hops; uint plan; uint pad0; uint pad1; uint pad2;
} pc;

shared uint s_ok[64];
shared uint s_n;
shared uint s_room;
shared uint s_tail;
shared uint s_taken;
shared uint s_left;
shared uint s_rejected;

void main()
{
    uint t = gl_LocalInvocationID.x;
    if (t == 0u) {
        s_n = min(batch.count, batch.capacity);
        s_room = inbox.capacity - (inbox.tail - inbox.head);
        s_tail = inbox.tail;
        s_taken = 0u; s_left = 0u; s_rejected = 0u;
    }
    VKM_SYNC();
    uint n = s_n;
    uint words = batch.slot_words;
    for (uint base = 0u; base < n; base += 64u) {
        uint i = base + t;
        uint m = i * words;
        bool match = i < n && batch.words[m + VKM_DST] == pc.self_address
                     && (batch.words[m + VKM_FLAGS] & VKM_FLAG_DELIVERED) == 0u;
        bool reject = match && batch.words[m + VKM_TENANT] != pc.tenant;
        bool ok = match && !reject;
        s_ok[t] = ok ? 1u : 0u;
        VKM_SYNC();
        uint before = 0u, total = 0u;
        for (uint j = 0u; j < 64u; j++) {
            total += s_ok[j];
            if (j < t) before += s_ok[j];
        }
        uint pos = s_taken + before;
        if (reject) {
            batch.words[m + VKM_FLAGS] |= VKM_FLAG_DELIVERED;
            atomicAdd(s_rejected, 1u);
        }
        if (ok) {
            if (pos < s_room) {
                uint slot = (s_tail + pos) % inbox.capacity;
                uint flags = batch.words[m + VKM_FLAGS];
                if (pc.plan != 0u) {
                    batch.words[m + VKM_FLAGS] = (flags & VKM_FLAG_PRIORITY_MASK) | VKM_FLAG_DELIVERED
                                                 | VKM_FLAG_COPY | (slot << 16u);
                } else {
                    uint d = slot * inbox.slot_words;
                    for (uint w = 0u; w < words; w++)
                        inbox.words[d + w] = batch.words[m + w];
                    inbox.words[d + VKM_FLAGS] = flags & VKM_FLAG_PRIORITY_MASK;
                    inbox.words[d + VKM_HOPS] += pc.hops;
                    batch.words[m + VKM_FLAGS] = flags | VKM_FLAG_DELIVERED;
                }
            } else {
                atomicAdd(s_left, 1u);
            }
        }
        VKM_SYNC();
        if (t == 0u)
            s_taken = min(s_room, s_taken + total);
        VKM_SYNC();
    }
    if (t == 0u) {
        inbox.tail = s_tail + s_taken;
        status.words[pc.status_offset] = s_taken;
        status.words[pc.status_offset + 1u] = s_left;
        status.words[pc.status_offset + 2u] = s_rejected;
    }
}
