// The survey of a message batch, shared by kernel_survey.comp (a batch that came
// in) and kernel_finish.comp (the outbox it stamped): which kernels of this
// device, which other devices and how many unknown addresses and host messages
// it holds, looked up in the runtime's directory, and its lowest and highest
// destination. The includer declares the buffers `dir` (uvec4 entries[]: at
// address % table_size, (address, device index + 1, local slot, tenant)) and
// `status` (uint words[]), and runs in workgroups of 64 with VKM_SYNC.
#ifndef VKM_SURVEY_GLSL
#define VKM_SURVEY_GLSL

#define VKM_SURVEY_MASK_WORDS 8u

shared uint sv_mask[VKM_SURVEY_MASK_WORDS];
shared uint sv_devices;
shared uint sv_local;
shared uint sv_remote;
shared uint sv_host;
shared uint sv_unknown;
shared uint sv_min;
shared uint sv_max;

void vkm_survey_begin(uint t)
{
    if (t < VKM_SURVEY_MASK_WORDS)
        sv_mask[t] = 0u;
    if (t == 0u) {
        sv_devices = 0u; sv_local = 0u; sv_remote = 0u; sv_host = 0u; sv_unknown = 0u;
        sv_min = 0xffffffffu; sv_max = 0u;
    }
}

void vkm_survey_add(uint dest, uint table_size, uint device)
{
    atomicMin(sv_min, dest);
    atomicMax(sv_max, dest);
    if (dest == VKM_HOST) {
        atomicAdd(sv_host, 1u);
        return;
    }
    uvec4 e = dir.entries[dest % table_size];
    if (e.x != dest || e.y == 0u) {
        atomicAdd(sv_unknown, 1u);
    } else if (e.y - 1u == device) {
        atomicOr(sv_mask[(e.z / 32u) % VKM_SURVEY_MASK_WORDS], 1u << (e.z % 32u));
        atomicAdd(sv_local, 1u);
    } else {
        atomicOr(sv_devices, 1u << ((e.y - 1u) % 32u));
        atomicAdd(sv_remote, 1u);
    }
}

// The 16-word record of `n` messages at status word `o` (after a VKM_SYNC).
void vkm_survey_write(uint t, uint o, uint n)
{
    if (t < VKM_SURVEY_MASK_WORDS)
        status.words[o + t] = sv_mask[t];
    if (t == 0u) {
        status.words[o + 8u] = sv_devices;
        status.words[o + 9u] = sv_local;
        status.words[o + 10u] = sv_remote;
        status.words[o + 11u] = sv_host;
        status.words[o + 12u] = sv_unknown;
        status.words[o + 13u] = n;
        status.words[o + 14u] = sv_min;
        status.words[o + 15u] = sv_max;
    }
}

#endif
