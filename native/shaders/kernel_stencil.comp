#version 450
// Reference kernel: one row slab ("tile") of a 2D Jacobi heat-diffusion grid
// (src/vkmulti/kernels/reference.py). Integer math, so every device and the
// numpy reference agree bit for bit: new = (up + down + left + right + 2) >> 2.
// State 0 and 1 are two generations of the tile, (height + 2) rows of `width`
// ints with a halo row above and below; step s reads generation s % 2 and
// writes the other. The first and last columns are fixed (boundary).
// Halo rows come in as messages from the neighbours above (params.x) and
// below (params.y): tag FROM_ABOVE | chunk << 8 carries the row above this
// tile, FROM_BELOW | chunk << 8 the row below, split into payload-sized
// chunks. Without a message the stored halo row is used (fixed boundary, or
// the initial field at step 0). After the update the tile sends its new first
// row up and its new last row down, in deterministic slots.
#extension GL_GOOGLE_include_directive : require
#include "vkm_kernel_abi.glsl"

layout(local_size_x = 8, local_size_y = 8) in;

layout(std430, set = 0, binding = 2) buffer Field0 { int v[]; } f0;
layout(std430, set = 0, binding = 3) buffer Field1 { int v[]; } f1;

#define FROM_ABOVE 1u
#define FROM_BELOW 2u

int rd(bool first, uint i) { return first ? f0.v[i] : f1.v[i]; }
void wr(bool first, uint i, int value) { if (first) f0.v[i] = value; else f1.v[i] = value; }

// The halo value at column x from this step's messages of `side`, or `stored`.
int halo(uint side, uint x, int stored)
{
    uint pw = vkm_step.payload_words;
    uint tag = side | ((x / pw) << 8u);
    uint n = vkm_inbox_count();
    for (uint i = 0u; i < n; i++) {
        uint m = vkm_in(i);
        if (vkm_in_field(m, VKM_TAG) == tag)
            return int(vkm_in_payload(m, x % pw));
    }
    return stored;
}

void main()
{
    uint width = vkm_step.params.z, height = vkm_step.params.w;
    uint up = vkm_step.params.x, down = vkm_step.params.y;
    uint x = gl_GlobalInvocationID.x, y = gl_GlobalInvocationID.y + 1u;   // row in halo coordinates
    uint pw = vkm_step.payload_words;
    uint chunks = (width + pw - 1u) / pw;
    uint n_up = up != 0u ? chunks : 0u;
    uint n_down = down != 0u ? chunks : 0u;

    if (gl_GlobalInvocationID.x == 0u && gl_GlobalInvocationID.y == 0u) {
        for (uint c = 0u; c < n_up; c++) {
            uint bytes = min(pw, width - c * pw) * 4u;
            vkm_emit_at(c, up, FROM_BELOW | (c << 8u), bytes);
        }
        for (uint c = 0u; c < n_down; c++) {
            uint bytes = min(pw, width - c * pw) * 4u;
            vkm_emit_at(n_up + c, down, FROM_ABOVE | (c << 8u), bytes);
        }
        vkm_outbox_set_count(n_up + n_down);
    }
    if (x >= width || y > height)
        return;

    bool src0 = (vkm_step.step_lo & 1u) == 0u;   // generation s % 2 is read, the other written
    uint row = y * width;
    int above = y == 1u ? halo(FROM_ABOVE, x, rd(src0, x)) : rd(src0, row - width + x);
    int below = y == height ? halo(FROM_BELOW, x, rd(src0, (height + 1u) * width + x))
                            : rd(src0, row + width + x);
    if (y == 1u)
        wr(!src0, x, above);                            // keep the halo for later steps
    if (y == height)
        wr(!src0, (height + 1u) * width + x, below);
    int value;
    if (x == 0u || x == width - 1u)
        value = rd(src0, row + x);
    else
        value = (above + below + rd(src0, row + x - 1u) + rd(src0, row + x + 1u) + 2) >> 2;
    wr(!src0, row + x, value);

    if (y == 1u && up != 0u)
        vkm_set_payload((x / pw) * vkm_outbox.slot_words, x % pw, uint(value));
    if (y == height && down != 0u)
        vkm_set_payload((n_up + x / pw) * vkm_outbox.slot_words, x % pw, uint(value));
}
