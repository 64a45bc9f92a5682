#version 450
// CRC32 (IEEE, zlib's) of a byte range of a buffer, computed on the GPU
// (src/vkmulti/kernels/gpu_crc.py). Live migration checks the state that
// arrived on the destination GPU against the source's without reading either
// through the host. One dispatch per range, no passes between workgroups:
//
// The raw CRC (register from 0, no final xor) is linear over GF(2): the raw
// CRC of a message is the xor over its words w at word position p of
// Z(nbytes - 4p)(w), where Z(n) appends n zero bytes to a CRC register (a
// 32x32 bit matrix, applied here as 4 lookups in a 4x256 table).
//
// Workgroup b hashes the block of 64 * lane_words words starting at word
// b * 64 * lane_words, in one of two layouts (push constant `contiguous`):
// - interleaved (GPUs): lane l takes words l, l + 64, l + 128, ... of its
//   block (neighbouring lanes read neighbouring words: coalesced) and runs
//   Horner's rule s = Z(256)(s) ^ w over them, then shifts s to the end of the
//   block (full blocks: by 4 * (64 - l) bytes);
// - contiguous (CPU devices: llvmpipe runs it ~2x faster): lane l hashes words
//   [l * lane_words, (l + 1) * lane_words) of its block with slice-by-4
//   (s ^= w; s = Z(4)(s)), then shifts s by the 4 * lane_words * (63 - l)
//   bytes after its piece in the block.
// The table of the loop's Z(256) or Z(4) is in shared memory. A lane of the
// last, partial block shifts its s to the end of the range instead. The
// lanes' values are xored together in shared memory, lane 0 shifts the
// block's value to the end of the range and xors it into results[out_index]
// (zeroed by the host beforehand). Workgroup 0 also hashes the 1-3 tail bytes
// of a range whose size is not a multiple of 4 (they end the range: no shift).
// The host finishes: crc = raw ^ Z(nbytes)(0xFFFFFFFF) ^ 0xFFFFFFFF.
//
// binding 2: 32 tables of 4 x 256 words; table k is Z(2^k): entry
// [k * 1024 + j * 256 + v] = Z(2^k)(v << 8j). Table 0 row 0 is zlib's
// byte table (used for the tail bytes), table 8 is Z(256).
layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) readonly buffer Data { uint words[]; } data;
layout(std430, set = 0, binding = 1) buffer Results { uint raw[]; } results;
layout(std430, set = 0, binding = 2) readonly buffer Tables { uint entries[]; } tables;
layout(push_constant) uniform Params {
    uint word_offset; uint nbytes; uint lane_words; uint out_index; uint contiguous;
} pc;

shared uint hot[1024];
shared uint block_raw;

uint zeros(uint k, uint x)
{
    uint t = k * 1024u;
    return tables.entries[t + (x & 0xFFu)] ^ tables.entries[t + 256u + ((x >> 8) & 0xFFu)]
         ^ tables.entries[t + 512u + ((x >> 16) & 0xFFu)] ^ tables.entries[t + 768u + (x >> 24)];
}

// Z(n)(x): one table per set bit of n.
uint shift_bytes(uint x, uint n)
{
    while (n != 0u) {
        x = zeros(uint(findLSB(n)), x);
        n &= n - 1u;
    }
    return x;
}

void main()
{
    uint lane = gl_LocalInvocationID.x;
    uint hot_table = pc.contiguous != 0u ? 2u : 8u;
    for (uint i = lane; i < 1024u; i += 64u)
        hot[i] = tables.entries[hot_table * 1024u + i];
    if (lane == 0u)
        block_raw = 0u;
    barrier();

    uint nwords = pc.nbytes >> 2;
    uint block_words = 64u * pc.lane_words;
    uint base = gl_WorkGroupID.x * block_words;
    uint end = min(base + block_words, nwords);
    uint s = 0u;
    uint last = 0u;
    bool any = false;
    bool full = base + block_words <= nwords;
    uint mine = 0u;
    if (pc.contiguous != 0u) {
        uint first = base + lane * pc.lane_words;
        uint stop = min(first + pc.lane_words, end);
        for (uint p = first; p < stop; p++) {
            s ^= data.words[pc.word_offset + p];
            s = hot[s & 0xFFu] ^ hot[256u + ((s >> 8) & 0xFFu)] ^ hot[512u + ((s >> 16) & 0xFFu)] ^ hot[768u + (s >> 24)];
        }
        if (full)
            mine = shift_bytes(s, 4u * pc.lane_words * (63u - lane));
        else if (first < stop)
            mine = shift_bytes(s, pc.nbytes - 4u * stop);
    } else {
        for (uint p = base + lane; p < end; p += 64u) {
            s = hot[s & 0xFFu] ^ hot[256u + ((s >> 8) & 0xFFu)] ^ hot[512u + ((s >> 16) & 0xFFu)] ^ hot[768u + (s >> 24)];
            s ^= data.words[pc.word_offset + p];
            last = p;
            any = true;
        }
        if (full)
            mine = shift_bytes(s, 4u * (64u - lane));
        else if (any)
            mine = shift_bytes(s, pc.nbytes - 4u * last);
    }
    if (mine != 0u)
        atomicXor(block_raw, mine);
    barrier();
    if (lane != 0u)
        return;
    uint v = block_raw;
    if (full)
        v = shift_bytes(v, pc.nbytes - 4u * (base + block_words));
    uint tail = pc.nbytes & 3u;
    if (gl_WorkGroupID.x == 0u && tail != 0u) {
        uint w = data.words[pc.word_offset + nwords];
        uint c = 0u;
        for (uint i = 0u; i < tail; i++)
            c = (c >> 8) ^ tables.entries[(c ^ (w >> (8u * i))) & 0xFFu];
        v ^= c;
    }
    if (v != 0u)
        atomicXor(results.raw[pc.out_index], v);
}
