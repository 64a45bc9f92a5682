#version 450
// Device-local copy of `count` 16-byte words between two storage buffers, for
// the CUDA_PEER link (vkm_kcopy.c): shader cores move device memory several
// times faster than vkCmdCopyBuffer does on NVIDIA (bench/RESULTS.md).
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) readonly buffer Src { uvec4 src[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Dst { uvec4 dst[]; };
layout(push_constant) uniform Params { uint src_first; uint dst_first; uint count; uint unused; } p;

void main()
{
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < p.count; i += stride)
        dst[p.dst_first + i] = src[p.src_first + i];
}
