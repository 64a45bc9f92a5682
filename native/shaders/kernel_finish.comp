#version 450
// The runtime's pass after each kernel step (src/vkmulti/kernels/runtime.py):
// advances the kernel's hybrid logical clock past every message it consumed,
// stamps each outbox message (source, per-pair sequence number, HLC, tenant),
// copies the messages addressed to the host into the kernel's host-visible
// K2H report, marks the inbox consumed and records what happened.
// Messages the host routes on the kernel's behalf (the K2K router's
// route_message) wait in the last `inject_count` slots of the report region;
// they are appended after the kernel's own messages as far as the outbox has
// room (`inject_taken` says how many) and stamped with them, so they share the
// kernel's sequence numbers and clock.
// Last, where `survey` is set, it surveys the outbox it stamped as
// kernel_survey.comp surveys a batch (who the messages address, by the
// runtime's directory) into the step's status record: one dispatch, not two.
#extension GL_GOOGLE_include_directive : require
#define VKM_RUNTIME_PASS
#include "vkm_kernel_abi.glsl"

layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) buffer Control {
    uint address; uint tenant; uint step_lo; uint step_hi;
    uint clock_lo; uint clock_hi; uint clock_logical; uint table_size;
    uint pad[8];
    uvec4 seq_table[];   // at dest % table_size: (dest address, next sequence lo, hi, 0)
} ctl;
layout(std430, set = 0, binding = 1) buffer Inbox {
    uint head; uint tail; uint capacity; uint slot_words; uint pad[12]; uint words[];
} inbox;
layout(std430, set = 0, binding = 2) buffer Outbox {
    uint count; uint step_lo; uint capacity; uint slot_words; uint pad[12]; uint words[];
} outbox;
layout(std430, set = 0, binding = 3) buffer Report {
    uint host_count; uint out_count; uint overflow; uint in_count;
    uint step_lo; uint step_hi; uint clock_lo; uint clock_hi;
    uint clock_logical; uint inject_count; uint inject_taken; uint pad[5];
    uint words[];        // the messages for the host, in outbox order
} report;
layout(std430, set = 0, binding = 4) readonly buffer Directory { uvec4 entries[]; } dir;
layout(std430, set = 0, binding = 5) buffer Status { uint words[]; } status;
layout(push_constant) uniform Params {
    uint now_lo; uint now_hi; uint step_lo; uint step_hi;
    uint status_offset; uint device; uint table_size; uint survey;
} pc;

#include "vkm_survey.glsl"

shared uint r_hi[64];
shared uint r_lo[64];
shared uint r_l[64];
shared uint s_dest[64];
shared uint s_n_in;
shared uint s_n_out;
shared uint s_p_lo;
shared uint s_p_hi;
shared uint s_l;
shared uint s_host;
shared uint s_inject_src;
shared uint s_inject_dst;

bool hlc_greater(uint ahi, uint alo, uint al, uint bhi, uint blo, uint bl)
{
    return ahi > bhi || (ahi == bhi && (alo > blo || (alo == blo && al > bl)));
}

uvec2 add64(uvec2 a, uint b)
{
    uint carry;
    uint lo = uaddCarry(a.x, b, carry);
    return uvec2(lo, a.y + carry);
}

uvec2 max64(uvec2 a, uvec2 b) { return (a.y > b.y || (a.y == b.y && a.x >= b.x)) ? a : b; }

void main()
{
    uint t = gl_LocalInvocationID.x;
    if (t == 0u) {
        s_n_in = min(inbox.tail - inbox.head, inbox.capacity);
        uint c = outbox.count;
        uint n = min(c, outbox.capacity);
        report.overflow = c > outbox.capacity ? c - outbox.capacity : 0u;
        uint k = min(report.inject_count, outbox.capacity);
        uint take = min(k, outbox.capacity - n);
        s_inject_src = outbox.capacity - k;
        s_inject_dst = n;
        s_n_out = n + take;
        report.inject_taken = take;
        s_host = 0u;
    }
    VKM_SYNC();

    // 0. host-routed messages go after the kernel's own (before any host message overwrites their slots)
    {
        uint sw = outbox.slot_words;
        uint total = (s_n_out - s_inject_dst) * sw;
        uint from = s_inject_src * sw, to = s_inject_dst * sw;
        for (uint w = t; w < total; w += 64u)
            outbox.words[to + w] = report.words[from + w];
    }
    VKM_SYNC();

    // 1. the newest timestamp among the messages this step consumed
    uint bhi = 0u, blo = 0u, bl = 0u;
    for (uint i = t; i < s_n_in; i += 64u) {
        uint m = ((inbox.head + i) % inbox.capacity) * inbox.slot_words;
        uint hi = inbox.words[m + VKM_HLC_HI], lo = inbox.words[m + VKM_HLC_LO];
        uint l = inbox.words[m + VKM_HLC_LOGICAL];
        if (hlc_greater(hi, lo, l, bhi, blo, bl)) { bhi = hi; blo = lo; bl = l; }
    }
    r_hi[t] = bhi; r_lo[t] = blo; r_l[t] = bl;
    VKM_SYNC();
    for (uint s = 32u; s > 0u; s >>= 1u) {
        if (t < s && hlc_greater(r_hi[t + s], r_lo[t + s], r_l[t + s], r_hi[t], r_lo[t], r_l[t])) {
            r_hi[t] = r_hi[t + s]; r_lo[t] = r_lo[t + s]; r_l[t] = r_l[t + s];
        }
        VKM_SYNC();
    }

    // 2. the HLC receive rule: p = max(clock, now, newest received); l counts events within p
    if (t == 0u) {
        uvec2 cp = uvec2(ctl.clock_lo, ctl.clock_hi);
        uint cl = ctl.clock_logical;
        uvec2 np = uvec2(pc.now_lo, pc.now_hi);
        uvec2 rp = uvec2(r_lo[0], r_hi[0]);
        uint rl = r_l[0];
        bool received = s_n_in > 0u;
        uvec2 p = max64(cp, np);
        if (received)
            p = max64(p, rp);
        bool from_clock = p == cp;
        bool from_received = received && p == rp;
        uint l = 0u;
        if (from_clock && from_received)
            l = max(cl, rl) + 1u;
        else if (from_clock)
            l = cl + 1u;
        else if (from_received)
            l = rl + 1u;
        s_p_lo = p.x; s_p_hi = p.y; s_l = l;
    }
    VKM_SYNC();

    // 3. stamp the outbox in slot order; message i gets (p, l + i)
    uint n_out = s_n_out;
    uint words = outbox.slot_words;
    uint max_len = (words - VKM_ENV_WORDS) * 4u;
    for (uint base = 0u; base < n_out; base += 64u) {
        uint chunk = min(64u, n_out - base);
        uint i = base + t;
        bool valid = t < chunk;
        uint m = i * words;
        uint dest = valid ? outbox.words[m + VKM_DST] : 0u;
        s_dest[t] = dest;
        VKM_SYNC();
        uint rank = 0u, host_before = 0u, host_in_chunk = 0u;
        bool last = true;
        for (uint j = 0u; j < chunk; j++) {
            uint dj = s_dest[j];
            if (dj == VKM_HOST)
                host_in_chunk++;
            if (j < t) {
                if (dj == dest) rank++;
                if (dj == VKM_HOST) host_before++;
            } else if (j > t && dj == dest) {
                last = false;
            }
        }
        uint idx = dest % ctl.table_size;
        uvec4 e = valid ? ctl.seq_table[idx] : uvec4(0u);
        VKM_SYNC();   // every read of the table before any write
        if (valid) {
            uvec2 seq = add64(e.x == dest ? e.yz : uvec2(0u), rank);
            if (last)
                ctl.seq_table[idx] = uvec4(dest, add64(seq, 1u), 0u);
            outbox.words[m + VKM_SRC] = ctl.address;
            outbox.words[m + VKM_SEQ_LO] = seq.x;
            outbox.words[m + VKM_SEQ_HI] = seq.y;
            outbox.words[m + VKM_HLC_LO] = s_p_lo;
            outbox.words[m + VKM_HLC_HI] = s_p_hi;
            outbox.words[m + VKM_HLC_LOGICAL] = s_l + i;
            outbox.words[m + VKM_LEN] = min(outbox.words[m + VKM_LEN], max_len);
            outbox.words[m + VKM_TENANT] = ctl.tenant;
            outbox.words[m + VKM_HOPS] = 0u;
            outbox.words[m + VKM_FLAGS] &= VKM_FLAG_PRIORITY_MASK;
            if (dest == VKM_HOST) {
                uint k = (s_host + host_before) * words;
                for (uint w = 0u; w < words; w++)
                    report.words[k + w] = outbox.words[m + w];
            }
        }
        VKM_SYNC();
        if (t == 0u)
            s_host += host_in_chunk;
        VKM_SYNC();
    }

    // 4. the step's record; the inbox is consumed
    if (t == 0u) {
        uint l_end = n_out > 0u ? s_l + n_out - 1u : s_l;
        ctl.clock_lo = s_p_lo; ctl.clock_hi = s_p_hi; ctl.clock_logical = l_end;
        uvec2 next = add64(uvec2(pc.step_lo, pc.step_hi), 1u);
        ctl.step_lo = next.x; ctl.step_hi = next.y;
        inbox.head = inbox.tail;
        outbox.count = n_out;
        outbox.step_lo = pc.step_lo;
        report.host_count = s_host; report.out_count = n_out; report.in_count = s_n_in;
        report.step_lo = pc.step_lo; report.step_hi = pc.step_hi;
        report.clock_lo = s_p_lo; report.clock_hi = s_p_hi; report.clock_logical = l_end;
    }

    // 5. the survey of the stamped outbox (the record kernel_survey.comp writes)
    if (pc.survey == 0u)
        return;
    vkm_survey_begin(t);
    VKM_SYNC();
    for (uint i = t; i < n_out; i += 64u)
        vkm_survey_add(outbox.words[i * words + VKM_DST], pc.table_size, pc.device);
    VKM_SYNC();
    vkm_survey_write(t, pc.status_offset, n_out);
}
