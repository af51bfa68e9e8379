/*
 * Test helper for scripts/install-check.sh, never shipped: an LD_PRELOAD library that holds
 * every umount2() for 300 ms. It widens, on purpose, the moment between the AppImage
 * runtime's FUSE server deciding to stop and its mount being gone, so that the check can
 * land a second SIGTERM there every time (a dying app with many threads sends one per
 * thread it reparents the server to) instead of once in many starts.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <unistd.h>

int umount2(const char *target, int flags) {
    static int (*real)(const char *, int);
    if (!real) real = (int (*)(const char *, int))dlsym(RTLD_NEXT, "umount2");
    usleep(300000);
    return real(target, flags);
}
