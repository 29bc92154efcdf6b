/* bench/lib/hiccup.c: how long the machine itself keeps a ready thread off its CPU.
 *
 *   hiccup SECONDS   sleeps 0.5 ms at a time for SECONDS and prints one JSON line: wakeups, how
 *                    many came more than 1, 2 and 4 ms late, and the latest (µs)
 *
 * bench/rls.sh runs one on each core beside a latency row, with the row's scheduling policy: a
 * thread that does nothing but sleep and wake sees only what the kernel, the hypervisor and other
 * tenants' processes do to it, so a stall it reports is one no server on that core could avoid.
 * (What jHiccup does for a JVM.) Built by rls.sh with the system's cc.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv) {
    const long long nap_ns = 500000;
    double seconds = argc > 1 ? atof(argv[1]) : 5.0;
    long long end = now_ns() + (long long)(seconds * 1e9);
    long long wakeups = 0, over1 = 0, over2 = 0, over4 = 0, worst = 0;
    struct timespec nap = {0, nap_ns};
    while (now_ns() < end) {
        long long before = now_ns();
        nanosleep(&nap, NULL);
        long long late = now_ns() - before - nap_ns;
        wakeups++;
        if (late > worst) worst = late;
        if (late > 1000000) over1++;
        if (late > 2000000) over2++;
        if (late > 4000000) over4++;
    }
    printf("{\"wakeups\":%lld,\"over_1ms\":%lld,\"over_2ms\":%lld,\"over_4ms\":%lld,\"max_us\":%lld}\n",
           wakeups, over1, over2, over4, worst / 1000);
    return 0;
}
