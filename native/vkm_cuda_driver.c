/* vkm_cuda_driver.c - the CUDA driver, loaded once per process (see vkm_cuda.h). */
#include "vkm_cuda.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#define MAX_CUDA_DEVICES 64

vkm_cuda_api vkm_cu;

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static int loaded;          /* a load was tried (under load_lock; read with acquire) */
static int usable;          /* ... and CUDA works */
static char why_not[512] = "the CUDA driver was not loaded yet";
static char visible_devices[256];
static int have_visible;
static int count;
static struct {
    vkm_CUdevice dev;
    uint8_t uuid[16];
    char name[128];
    int cc_major, cc_minor, sm_count; /* 0 when the driver does not say */
} devs[MAX_CUDA_DEVICES];
/* cuDeviceGetAttribute: looked up on its own so a driver without it still serves CUDA_PEER */
static vkm_CUresult (*get_attribute)(int *value, int attribute, vkm_CUdevice dev);
#define CU_ATTR_MULTIPROCESSOR_COUNT 16
#define CU_ATTR_COMPUTE_CAPABILITY_MAJOR 75
#define CU_ATTR_COMPUTE_CAPABILITY_MINOR 76

const char *vkm_cuda_text(vkm_CUresult r, char *buf, size_t n)
{
    const char *name = NULL, *desc = NULL;
    if (vkm_cu.cuGetErrorName && vkm_cu.cuGetErrorName(r, &name) != VKM_CUDA_SUCCESS) name = NULL;
    if (vkm_cu.cuGetErrorString && vkm_cu.cuGetErrorString(r, &desc) != VKM_CUDA_SUCCESS) desc = NULL;
    snprintf(buf, n, "%s (%d)%s%s", name ? name : "CUresult", (int)r, desc ? ": " : "", desc ? desc : "");
    return buf;
}

VkResult vkm_cuda_fail(vkm_error *err, const char *where, vkm_CUresult cr)
{
    char t[256];
    return vkm_fail(err, VKM_ERROR_CUDA, where, "CUDA's %s returned %s", where, vkm_cuda_text(cr, t, sizeof t));
}

/* Load and initialise; fills why_not on failure. Under load_lock. */
static int load(const char *path)
{
    if (!path || !*path) path = "libcuda.so.1";
    dlerror();
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(why_not, sizeof why_not, "the NVIDIA CUDA driver (%s) could not be loaded: %s", path,
                 e ? e : "not found");
        return 0;
    }
    /* never dlclose'd: the driver does not support being unloaded */
#define VKM_CUDA_LOAD(field, symbol, fallback, params)                                                  \
    *(void **)&vkm_cu.field = dlsym(lib, #symbol);                                                      \
    if (!vkm_cu.field && strcmp(#fallback, "none") != 0) *(void **)&vkm_cu.field = dlsym(lib, #fallback); \
    if (!vkm_cu.field) {                                                                                \
        snprintf(why_not, sizeof why_not,                                                               \
                 "%s has no %s: the NVIDIA driver is too old for CUDA_PEER (Vulkan memory interop "    \
                 "and exportable CUDA memory need a CUDA 11.2 or newer driver)", path, #symbol);              \
        return 0;                                                                                       \
    }
    VKM_CUDA_FUNCTIONS(VKM_CUDA_LOAD)
#undef VKM_CUDA_LOAD
    *(void **)&get_attribute = dlsym(lib, "cuDeviceGetAttribute");
    char t[256];
    vkm_CUresult r = vkm_cu.cuInit(0);
    if (r != VKM_CUDA_SUCCESS) {
        snprintf(why_not, sizeof why_not, "cuInit returned %s", vkm_cuda_text(r, t, sizeof t));
        return 0;
    }
    int n = 0;
    r = vkm_cu.cuDeviceGetCount(&n);
    if (r != VKM_CUDA_SUCCESS) {
        snprintf(why_not, sizeof why_not, "cuDeviceGetCount returned %s", vkm_cuda_text(r, t, sizeof t));
        return 0;
    }
    if (n > MAX_CUDA_DEVICES) n = MAX_CUDA_DEVICES;
    for (int i = 0; i < n; i++) {
        vkm_CUuuid u;
        r = vkm_cu.cuDeviceGet(&devs[i].dev, i);
        if (r == VKM_CUDA_SUCCESS) r = vkm_cu.cuDeviceGetUuid(&u, devs[i].dev);
        if (r != VKM_CUDA_SUCCESS) {
            snprintf(why_not, sizeof why_not, "CUDA device %d cannot be named (cuDeviceGet/cuDeviceGetUuid "
                     "returned %s)", i, vkm_cuda_text(r, t, sizeof t));
            return 0;
        }
        memcpy(devs[i].uuid, u.bytes, 16);
        if (vkm_cu.cuDeviceGetName(devs[i].name, (int)sizeof devs[i].name, devs[i].dev) != VKM_CUDA_SUCCESS)
            snprintf(devs[i].name, sizeof devs[i].name, "CUDA device %d", i);
        devs[i].name[sizeof devs[i].name - 1] = 0;
        if (get_attribute) {
            int v[3] = {0, 0, 0};
            if (get_attribute(&v[0], CU_ATTR_COMPUTE_CAPABILITY_MAJOR, devs[i].dev) == VKM_CUDA_SUCCESS &&
                get_attribute(&v[1], CU_ATTR_COMPUTE_CAPABILITY_MINOR, devs[i].dev) == VKM_CUDA_SUCCESS) {
                devs[i].cc_major = v[0];
                devs[i].cc_minor = v[1];
            }
            if (get_attribute(&v[2], CU_ATTR_MULTIPROCESSOR_COUNT, devs[i].dev) == VKM_CUDA_SUCCESS)
                devs[i].sm_count = v[2];
        }
    }
    count = n;
    return 1;
}

int vkm_cuda_load(const char *path, const char *visible, char *reason, size_t reason_len)
{
    if (!__atomic_load_n(&loaded, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&load_lock);
        if (!loaded) {
            have_visible = visible != NULL;
            snprintf(visible_devices, sizeof visible_devices, "%s", visible ? visible : "");
            usable = load(path);
            __atomic_store_n(&loaded, 1, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&load_lock);
    }
    return vkm_cuda_available(reason, reason_len);
}

int vkm_cuda_available(char *reason, size_t reason_len)
{
    int ok = __atomic_load_n(&loaded, __ATOMIC_ACQUIRE) && usable;
    if (!ok && reason && reason_len) snprintf(reason, reason_len, "%s", why_not);
    return ok;
}

int vkm_cuda_device_count(void)
{
    return vkm_cuda_available(NULL, 0) ? count : 0;
}

int vkm_cuda_device_info(int ordinal, uint8_t uuid[16], char *name, size_t name_len)
{
    if (!vkm_cuda_available(NULL, 0) || ordinal < 0 || ordinal >= count) return 0;
    if (uuid) memcpy(uuid, devs[ordinal].uuid, 16);
    if (name && name_len) snprintf(name, name_len, "%s", devs[ordinal].name);
    return 1;
}

int vkm_cuda_device_attributes(int ordinal, int *cc_major, int *cc_minor, int *sm_count)
{
    if (!vkm_cuda_available(NULL, 0) || ordinal < 0 || ordinal >= count) return 0;
    *cc_major = devs[ordinal].cc_major;
    *cc_minor = devs[ordinal].cc_minor;
    *sm_count = devs[ordinal].sm_count;
    return 1;
}

vkm_CUdevice vkm_cuda_device(int ordinal)
{
    return devs[ordinal].dev;
}

int vkm_cuda_find(const uint8_t uuid[16])
{
    for (int i = 0; i < count; i++)
        if (memcmp(devs[i].uuid, uuid, 16) == 0) return i;
    return -1;
}

static void uuid_text(const uint8_t u[16], char out[37])
{
    snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
             u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

int vkm_cuda_peer_ok(int ia, int ib, const char *name_a, const char *name_b, char *reason, size_t reason_len)
{
    if (ia == ib) {
        snprintf(reason, reason_len, "'%s' and '%s' are the same CUDA device (%d); CUDA_PEER needs two GPUs",
                 name_a, name_b, ia);
        return 0;
    }
    int ab = 0, ba = 0;
    char t[256];
    vkm_CUresult r = vkm_cu.cuDeviceCanAccessPeer(&ab, devs[ia].dev, devs[ib].dev);
    if (r == VKM_CUDA_SUCCESS) r = vkm_cu.cuDeviceCanAccessPeer(&ba, devs[ib].dev, devs[ia].dev);
    if (r != VKM_CUDA_SUCCESS) {
        snprintf(reason, reason_len, "CUDA cannot tell whether '%s' and '%s' have peer access "
                 "(cuDeviceCanAccessPeer returned %s)", name_a, name_b, vkm_cuda_text(r, t, sizeof t));
        return 0;
    }
    if (!ab || !ba) {
        snprintf(reason, reason_len,
                 "CUDA reports no peer access between '%s' (CUDA device %d) and '%s' (CUDA device %d): no NVLink "
                 "or PCIe peer-to-peer path",
                 name_a, ia, name_b, ib);
        return 0;
    }
    return 1;
}

int vkm_cuda_peer_check(const uint8_t uuid_a[16], const char *name_a, const uint8_t uuid_b[16],
                        const char *name_b, char *reason, size_t reason_len)
{
    char tmp[8];
    if (!reason || !reason_len) {
        reason = tmp;
        reason_len = sizeof tmp;
    }
    reason[0] = 0;
    if (!vkm_cuda_available(reason, reason_len)) return 0;
    const uint8_t *uuids[2] = {uuid_a, uuid_b};
    const char *names[2] = {name_a ? name_a : "the source device", name_b ? name_b : "the destination device"};
    int idx[2];
    for (int k = 0; k < 2; k++) {
        idx[k] = vkm_cuda_find(uuids[k]);
        if (idx[k] < 0) {
            char u[37], seen[256] = "";
            uuid_text(uuids[k], u);
            for (int i = 0; i < count && strlen(seen) < sizeof seen - 40; i++) {
                size_t len = strlen(seen);
                snprintf(seen + len, sizeof seen - len, "%s'%s'", i ? ", " : "", devs[i].name);
            }
            snprintf(reason, reason_len,
                     "'%s' (deviceUUID %s) is not a CUDA device (CUDA sees %d: %s)%s%s", names[k], u, count,
                     count ? seen : "none", have_visible ? "; CUDA_VISIBLE_DEVICES=" : "",
                     have_visible ? visible_devices : "");
            return 0;
        }
    }
    return vkm_cuda_peer_ok(idx[0], idx[1], names[0], names[1], reason, reason_len);
}
