#version 450
// Tightly packed texels of a storage buffer, from texel `first`, into rows
// [row0, row0 + rows) of an image with 16-byte texels through a rgba32ui view
// (bit-exact) (vkm_kcopy.c).
layout(local_size_x = 64, local_size_y = 4) in;
layout(std430, set = 0, binding = 0) readonly buffer Src { uvec4 src[]; };
layout(set = 0, binding = 1, rgba32ui) uniform writeonly uimage2D img;
layout(push_constant) uniform Params { uint first; uint row0; uint rows; uint width; } p;

void main()
{
    uvec2 g = gl_GlobalInvocationID.xy;
    if (g.x >= p.width || g.y >= p.rows)
        return;
    uvec4 t = src[p.first + g.y * p.width + g.x];
    imageStore(img, ivec2(g.x, p.row0 + g.y), t);
}
