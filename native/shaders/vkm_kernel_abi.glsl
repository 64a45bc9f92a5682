// vkm_kernel_abi.glsl - the binding ABI of vkmulti compute kernels (docs/reference/kernels.md).
//
// A kernel is launched once per step over its pending inbox:
//   set 0, binding 0   inbox   ring of message slots (the runtime appends, the step consumes all)
//   set 0, binding 1   outbox  this step's batch of message slots (the kernel appends)
//   set 0, binding 2+i state buffer i (device-local, kept between steps)
//   push constants     VkmStep: step number, own address, tenant, capacities, 4 user words
// A message slot is a 12-word envelope followed by the payload words; the
// runtime stamps source, sequence number, HLC timestamp and tenant after the
// step, the kernel writes destination, tag and payload length.
#ifndef VKM_KERNEL_ABI_GLSL
#define VKM_KERNEL_ABI_GLSL

#define VKM_ENV_WORDS 12u
#define VKM_SRC 0u
#define VKM_DST 1u
#define VKM_SEQ_LO 2u
#define VKM_SEQ_HI 3u
#define VKM_HLC_LO 4u
#define VKM_HLC_HI 5u
#define VKM_HLC_LOGICAL 6u
#define VKM_LEN 7u
#define VKM_TAG 8u
#define VKM_TENANT 9u
#define VKM_HOPS 10u
#define VKM_FLAGS 11u

#define VKM_FLAG_DELIVERED 1u
// Runtime-internal: set with the target inbox slot in bits 16-31 by a planning
// delivery pass, cleared by the copy pass that follows it. Bits 8-15: priority.
#define VKM_FLAG_COPY 2u
#define VKM_FLAG_PRIORITY_MASK 0xff00u
#define VKM_HOST 0u
#define VKM_FULL 0xffffffffu

#define VKM_SYNC() { memoryBarrierBuffer(); memoryBarrierShared(); barrier(); }

#ifndef VKM_RUNTIME_PASS
// Ring and batch headers are 16 words; slots follow.
layout(std430, set = 0, binding = 0) buffer VkmInbox {
    uint head;          // messages consumed so far (monotonic; slot = index % capacity)
    uint tail;          // messages written so far
    uint capacity;      // slots
    uint slot_words;    // VKM_ENV_WORDS + payload words
    uint header_pad[12];
    uint words[];
} vkm_inbox;

layout(std430, set = 0, binding = 1) buffer VkmOutbox {
    uint count;         // slots written this step (vkm_emit counts attempts past capacity too)
    uint step_lo;
    uint capacity;
    uint slot_words;
    uint header_pad[12];
    uint words[];
} vkm_outbox;

layout(push_constant) uniform VkmStep {
    uint step_lo;           // the number of this step (0 for the first), low and high word
    uint step_hi;
    uint self_address;      // this kernel's address (the source of what it sends)
    uint tenant;            // this kernel's tenant (0: none)
    uint inbox_capacity;    // slots of the inbox ring
    uint outbox_capacity;   // slots this step may emit
    uint payload_words;     // payload words per slot
    uint pad;
    uvec4 params;           // four user words (KernelRuntime.launch(params=...), Kernel.set_params)
} vkm_step;

// Pending messages this step (all are consumed when the step ends).
uint vkm_inbox_count() { return vkm_inbox.tail - vkm_inbox.head; }

// First word of the i-th pending message (0 <= i < vkm_inbox_count()), oldest first.
uint vkm_in(uint i) { return ((vkm_inbox.head + i) % vkm_inbox.capacity) * vkm_inbox.slot_words; }

uint vkm_in_field(uint m, uint field) { return vkm_inbox.words[m + field]; }
uint vkm_in_payload(uint m, uint w) { return vkm_inbox.words[m + VKM_ENV_WORDS + w]; }

// Fill slot `slot` of the outbox with a message header; returns its first word.
// Kernels that emit a known number of messages use this with vkm_outbox_set_count.
uint vkm_emit_at(uint slot, uint dest, uint tag, uint payload_bytes)
{
    uint m = slot * vkm_outbox.slot_words;
    vkm_outbox.words[m + VKM_DST] = dest;
    vkm_outbox.words[m + VKM_TAG] = tag;
    vkm_outbox.words[m + VKM_LEN] = payload_bytes;
    vkm_outbox.words[m + VKM_FLAGS] = 0u;
    return m;
}

// Reserve the next outbox slot from any invocation; VKM_FULL when the outbox
// is full (the runtime reports the overflow: keep the message in state and
// send it next step).
uint vkm_emit(uint dest, uint tag, uint payload_bytes)
{
    uint slot = atomicAdd(vkm_outbox.count, 1u);
    if (slot >= vkm_outbox.capacity)
        return VKM_FULL;
    return vkm_emit_at(slot, dest, tag, payload_bytes);
}

// Deterministic emitters: one invocation sets the number of slots written.
void vkm_outbox_set_count(uint n) { vkm_outbox.count = n; }

void vkm_set_payload(uint m, uint w, uint value) { vkm_outbox.words[m + VKM_ENV_WORDS + w] = value; }
#endif

#endif
