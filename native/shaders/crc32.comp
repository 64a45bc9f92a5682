#version 450
// CRC32 (IEEE, zlib's) of a byte range of a buffer, computed on the GPU
// (src/vkmulti/kernels/gpu_crc.py). Live migration checks the state that
// arrived on the destination GPU against the source's without reading either
// through the host.
//
// mode 0: invocation g computes the raw CRC (register starting at 0, no final
//         xor) of chunk g: words [word_offset + g * chunk_words, ...) of at
//         most chunk_words words, into crcs[out_offset + g]. Slice-by-4 tables
//         are built in shared memory by each workgroup.
// mode 1: one level of an in-order tree reduction over `count` chunk CRCs:
//         crcs[a] = shift(crcs[a], bytes of block b) ^ crcs[b] for
//         a = 2 * stride * i, b = a + stride. shift(x, n) appends n zero bytes,
//         a linear map applied as the product of the matrices for the set bits
//         of n (binding 2: 32 matrices, the k-th shifts by 2^k bytes, 32
//         column words each).
// The host finishes: crc = raw ^ shift(0xFFFFFFFF, total bytes) ^ 0xFFFFFFFF.
layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) readonly buffer Data { uint words[]; } data;
layout(std430, set = 0, binding = 1) buffer Crcs { uint crcs[]; } acc;
layout(std430, set = 0, binding = 2) readonly buffer Shift { uint columns[]; } shift;
layout(push_constant) uniform Params {
    uint mode; uint word_offset; uint nwords; uint chunk_words;
    uint stride; uint count; uint out_offset; uint pad;
} pc;

shared uint table[4 * 256];

uint apply(uint matrix, uint x)
{
    uint r = 0u;
    for (uint j = 0u; j < 32u; j++)
        if ((x & (1u << j)) != 0u)
            r ^= shift.columns[matrix * 32u + j];
    return r;
}

uint shift_bytes(uint x, uint n)
{
    for (uint k = 0u; k < 32u; k++)
        if ((n & (1u << k)) != 0u)
            x = apply(k, x);
    return x;
}

void chunk_crc()
{
    uint t = gl_LocalInvocationID.x;
    for (uint i = t; i < 256u; i += 64u) {
        uint c = i;
        for (uint k = 0u; k < 8u; k++)
            c = (c & 1u) != 0u ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        table[i] = c;
    }
    barrier();
    for (uint i = t; i < 256u; i += 64u) {
        uint c = table[i];
        for (uint s = 1u; s < 4u; s++) {
            c = (c >> 8) ^ table[c & 0xFFu];
            table[s * 256u + i] = c;
        }
    }
    barrier();
    uint g = gl_GlobalInvocationID.x;
    uint chunks = (pc.nwords + pc.chunk_words - 1u) / pc.chunk_words;
    if (g >= chunks)
        return;
    uint begin = g * pc.chunk_words;
    uint end = min(begin + pc.chunk_words, pc.nwords);
    uint crc = 0u;
    for (uint w = begin; w < end; w++) {
        crc ^= data.words[pc.word_offset + w];
        crc = table[768u + (crc & 0xFFu)] ^ table[512u + ((crc >> 8) & 0xFFu)]
            ^ table[256u + ((crc >> 16) & 0xFFu)] ^ table[crc >> 24];
    }
    acc.crcs[pc.out_offset + g] = crc;
}

void combine()
{
    uint i = gl_GlobalInvocationID.x;
    uint a = 2u * pc.stride * i;
    uint b = a + pc.stride;
    if (b >= pc.count)
        return;
    uint last = min(b + pc.stride, pc.count);
    uint words = min(last * pc.chunk_words, pc.nwords) - b * pc.chunk_words;
    acc.crcs[pc.out_offset + a] = shift_bytes(acc.crcs[pc.out_offset + a], words * 4u) ^ acc.crcs[pc.out_offset + b];
}

void main()
{
    if (pc.mode == 0u)
        chunk_crc();
    else
        combine();
}
