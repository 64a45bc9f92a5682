#version 450
// Reference SRU renderer: a Julia-set tile with a border, written to an RGBA16F
// storage image. Per-SRU push constants change the picture (seed, colours) and
// the cost (iterations: every pixel runs exactly that many steps, no early exit).
//
// Determinism: only integer hashing and float add/mul/compare/select/clamp, no
// transcendental functions and no float division, so devices of the same kind
// produce bit-identical images. `precise` keeps the compiler from fusing
// multiply-adds differently in different places.

layout(local_size_x = 8, local_size_y = 8, local_size_z = 1) in;

layout(set = 0, binding = 0, rgba16f) uniform writeonly image2D target;

layout(push_constant) uniform Params {
    vec4 color_a;      // escape colour (linear RGB, alpha ignored)
    vec4 color_b;      // interior and far-field colour
    uint seed;         // picks the Julia constant and the pattern phase
    uint iterations;   // steps per pixel: the cost knob
    float scale;       // plane units per pixel (host: 3.0 / min(width, height))
    uint border;       // border width in pixels (0: none)
} p;

uint hash_u32(uint x) {
    // lowbias32 (Chris Wellons): good avalanche, integer only
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

float unit_from(uint h) {
    // 24 random bits -> [0, 1), exact in float32
    return float(h >> 8) * (1.0 / 16777216.0);
}

void main() {
    ivec2 size = imageSize(target);
    ivec2 gid = ivec2(gl_GlobalInvocationID.xy);
    if (gid.x >= size.x || gid.y >= size.y) {
        return;
    }
    uint h1 = hash_u32(p.seed ^ 0x9e3779b9u);
    uint h2 = hash_u32(h1 + 0x632be5abu);
    // Julia constants near the boundary of the Mandelbrot set: connected, detailed sets
    precise vec2 c = vec2(-0.8 + 0.25 * unit_from(h1), 0.156 + 0.3 * (unit_from(h2) - 0.5));
    // pixel centre in plane units, centred on the tile; integers are exact in float32
    precise vec2 z = vec2(ivec2(2) * gid + ivec2(1) - size) * (0.5 * p.scale);

    uint n = 0u;
    precise float trap = 64.0;
    for (uint i = 0u; i < p.iterations; ++i) {
        precise float x2 = z.x * z.x;
        precise float y2 = z.y * z.y;
        bool inside = x2 + y2 <= 16.0;
        precise vec2 nz = clamp(vec2(x2 - y2 + c.x, 2.0 * z.x * z.y + c.y), vec2(-64.0), vec2(64.0));
        z = inside ? nz : z;
        n += inside ? 1u : 0u;
        precise float d = abs(nz.x) + abs(nz.y) * 0.5;
        trap = inside ? min(trap, d) : trap;
    }

    // escape speed in 1/1024 steps, by integer division (exact everywhere)
    uint k = (min(n, 48u) * 1024u) / 48u;
    precise float t = float(k) * (1.0 / 1024.0);
    precise vec3 col;
    if (n >= p.iterations) {
        precise float glow = clamp(1.0 - trap * 2.0, 0.0, 1.0);
        col = p.color_b.rgb * 0.2 + p.color_a.rgb * (glow * glow * 0.8);
    } else {
        precise float s = t * t;
        col = p.color_b.rgb * (1.0 - s) * 0.35 + p.color_a.rgb * s * 1.5;
    }
    // seed-coloured border so tiles read as tiles in the composited frame
    int b = int(p.border);
    if (gid.x < b || gid.y < b || gid.x >= size.x - b || gid.y >= size.y - b) {
        uint h3 = hash_u32(h2 ^ 0x85ebca6bu);
        col = vec3(unit_from(h3), unit_from(hash_u32(h3)), unit_from(hash_u32(h3 + 1u))) * 0.9 + 0.1;
    }
    imageStore(target, gid, vec4(col, 1.0));
}
