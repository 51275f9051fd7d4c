/* How far apart two CPUs are: the round trip of one cache line between a thread pinned to each.

       cc -O2 -pthread bench/core_trip.c -o /tmp/core_trip && /tmp/core_trip [CPU_A CPU_B]   (default 0 1)

   The dev VM runs in two modes that its sysfs cannot tell apart (one 32 MiB L3 shared by both vCPUs, either
   way): 76-78 ns a round trip, where hfr's node calls run at full speed, and 370-394 ns, where they take twice
   as long from 1 MiB up (bench/RESULTS.md, "The dev VM's slow mode"). Run this before trusting a dev VM number. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { TRIPS = 2000000 };
static _Atomic long word __attribute__((aligned(64)));  /* odd: the first CPU's turn is over; even: the second's */

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set)) {
        fprintf(stderr, "cannot run on CPU %d\n", cpu);
        exit(2);
    }
}

static void *answer(void *cpu) {
    pin(*(int *)cpu);
    for (long i = 0; i < TRIPS; i++) {
        while (atomic_load(&word) != 2 * i + 1)
            ;
        atomic_store(&word, 2 * i + 2);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int a = argc > 2 ? atoi(argv[1]) : 0, b = argc > 2 ? atoi(argv[2]) : 1;
    pthread_t other;
    struct timespec start, end;
    pin(a);
    pthread_create(&other, NULL, answer, &b);
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long i = 0; i < TRIPS; i++) {
        atomic_store(&word, 2 * i + 1);
        while (atomic_load(&word) != 2 * i + 2)
            ;
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    pthread_join(other, NULL);
    printf("CPUs %d and %d: %.1f ns a round trip\n", a, b,
           ((end.tv_sec - start.tv_sec) * 1e9 + (end.tv_nsec - start.tv_nsec)) / TRIPS);
    return 0;
}
