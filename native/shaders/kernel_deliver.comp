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
// With `plan` = 2 (direct: the K2K router expects the batch to be all this
// kernel's) the step first copied the batch's first `copied` slots into this
// inbox at ring slot 0 with a copy command; the pass starts the (empty) inbox
// at a multiple of its capacity, and if every message of the batch is this
// kernel's it takes them in place (copying only those past `copied`), else it
// delivers as in copy mode, overwriting the window as it goes. With `plan` = 3
// the host read the sending step's survey back already (all the batch's
// messages are this kernel's): the pass does not check them.
// With `plan` = 4 (in place: the host read the survey back, and no other
// device reads the region while this step does) nothing is copied: the
// kernel's step reads the batch where it lies (its inbox binding is the batch
// this step). The pass makes the batch's header an inbox header of its n
// messages without changing what other readers of the batch see (head =
// count = n, tail = 2n, capacity = n: every reader's min(count, capacity)
// stays n) and adds `hops` to each message's hop count; the runtime's next
// step of the sender writes the capacity back before it reuses the region.
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
    uint self_address; uint tenant; uint status_offset; uint hops; uint plan; uint copied; uint pad1; uint pad2;
} pc;

#define MODE_PLAN 1u
#define MODE_DIRECT 2u
#define MODE_DIRECT_KNOWN 3u   // direct, and the host read back the sender's survey: all this kernel's
#define MODE_IN_PLACE 4u       // all this kernel's, read by its step where it lies (no copy)

shared uint s_ok[64];
shared uint s_n;
shared uint s_room;
shared uint s_tail;
shared uint s_taken;
shared uint s_left;
shared uint s_rejected;
shared uint s_bad;

void main()
{
    uint t = gl_LocalInvocationID.x;
    if (pc.plan == MODE_IN_PLACE) {
        uint n = min(batch.count, batch.capacity);
        for (uint i = t; i < n; i += 64u)
            batch.words[i * batch.slot_words + VKM_HOPS] += pc.hops;
        VKM_SYNC();
        if (t == 0u) {
            batch.count = n;                // (already n: the sender's finish pass clamps it)
            batch.step_lo = 2u * n;         // the inbox view: head n, tail 2n, slot (n + i) % n = i
            batch.capacity = max(n, 1u);
            status.words[pc.status_offset] = n;
            status.words[pc.status_offset + 1u] = 0u;
            status.words[pc.status_offset + 2u] = 0u;
            status.words[pc.status_offset + 3u] = n;
        }
        return;
    }
    if (t == 0u) {
        s_n = min(batch.count, batch.capacity);
        uint tail = inbox.tail;
        if (pc.plan >= MODE_DIRECT) {   // empty between steps: start at ring slot 0, where the window is
            uint c = inbox.capacity;
            uint r = tail % c;
            uint w = r == 0u ? tail : tail + (c - r);
            if (w < tail || w > 0xffffffffu - c)
                w = 0u;   // the counters would pass 2^32: start again at 0
            inbox.head = w;
            tail = w;
        }
        s_room = inbox.capacity - (tail - inbox.head);
        s_tail = tail;
        s_taken = 0u; s_left = 0u; s_rejected = 0u; s_bad = 0u;
    }
    VKM_SYNC();
    uint n = s_n;
    uint words = batch.slot_words;
    if (pc.plan >= MODE_DIRECT) {
        for (uint i = t; i < n && pc.plan == MODE_DIRECT; i += 64u) {
            uint m = i * words;
            if (batch.words[m + VKM_DST] != pc.self_address || batch.words[m + VKM_TENANT] != pc.tenant
                    || (batch.words[m + VKM_FLAGS] & VKM_FLAG_DELIVERED) != 0u)
                atomicAdd(s_bad, 1u);
        }
        VKM_SYNC();
        if (s_bad == 0u && n <= s_room) {   // all this kernel's: take them where they are
            // (a batch's flags hold only the priority until a pass delivers from it, and its hop
            // count is 0: the sender's finish pass set both; the host lets no other pass take them)
            for (uint i = t; i < n; i += 64u) {
                uint m = i * words;
                uint d = i * inbox.slot_words;
                if (i >= pc.copied) {   // past what the copy command moved
                    for (uint w = 0u; w < words; w++)
                        inbox.words[d + w] = batch.words[m + w];
                }
                inbox.words[d + VKM_HOPS] = batch.words[m + VKM_HOPS] + pc.hops;
            }
            VKM_SYNC();
            if (t == 0u) {
                inbox.tail = s_tail + n;
                status.words[pc.status_offset] = n;
                status.words[pc.status_offset + 1u] = 0u;
                status.words[pc.status_offset + 2u] = 0u;
                status.words[pc.status_offset + 3u] = n;
            }
            return;
        }
    }
    bool plan = pc.plan == MODE_PLAN;
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
                if (plan) {
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
        status.words[pc.status_offset + 3u] = n;   // the batch's count (a direct pass that took all: = taken)
        if (plan) {   // the copy pass's workgroups (vkCmdDispatchIndirect): none when nothing was planned
            status.words[pc.status_offset + 4u] = s_taken > 0u ? min(n, 65535u) : 0u;
            status.words[pc.status_offset + 5u] = 1u;
            status.words[pc.status_offset + 6u] = 1u;
        }
    }
}
