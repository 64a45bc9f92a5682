#version 450
// Rows [row0, row0 + rows) of an image with 4-byte texels, read through a
// r32ui view (bit-exact), into tightly packed texels of a storage buffer
// starting at texel `first` (vkm_kcopy.c).
layout(local_size_x = 64, local_size_y = 4) in;
layout(std430, set = 0, binding = 1) writeonly buffer Dst { uint dst[]; };
layout(set = 0, binding = 0, r32ui) uniform readonly uimage2D img;
layout(push_constant) uniform Params { uint first; uint row0; uint rows; uint width; } p;

void main()
{
    uvec2 g = gl_GlobalInvocationID.xy;
    if (g.x >= p.width || g.y >= p.rows)
        return;
    dst[p.first + g.y * p.width + g.x] = imageLoad(img, ivec2(g.x, p.row0 + g.y)).x;
}
