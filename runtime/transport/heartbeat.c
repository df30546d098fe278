/* The heartbeat: a thread of its own answering PING with PONG (how long the current message
 * has run, how many finished), so that the head can tell a busy device from a dead one. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <zmq.h>

#include "core/core.h"
#include "transport/net.h"

struct loip_heartbeat {
    loip_sock *sock;       /* used by the thread only, after creation */
    pthread_t thread;
    atomic_int stop;
    _Atomic uint64_t busy_since; /* loip_now_ns() when the current message started, 0: idle */
    _Atomic uint64_t done;
    _Atomic uint64_t last_ping; /* loip_now_ns() of the last PING answered, 0: none yet */
};

static void *heartbeat_main(void *arg) {
    loip_heartbeat *hb = arg;
    char from[64];
    uint8_t buf[256];
    while (!atomic_load(&hb->stop)) {
        loip_msg_header h;
        int rc = loip_sock_recv(hb->sock, 100, &h, buf, sizeof buf, from);
        if (rc != LOIP_OK && zmq_errno() == ETERM) { /* the net is being freed: close, and stop */
            loip_sock_close_z(hb->sock);
            break;
        }
        if (rc != LOIP_OK || h.kind != LOIP_MSG_PING) continue;
        uint64_t since = atomic_load(&hb->busy_since), now = loip_now_ns();
        atomic_store(&hb->last_ping, now);
        uint64_t reply[2] = {since && now > since ? now - since : 0, atomic_load(&hb->done)};
        loip_msg_header r = {.kind = LOIP_MSG_PONG, .dtype = -1, .step = h.step, .payload_bytes = sizeof reply};
        loip_sock_send(hb->sock, from, &r, reply, 100);
    }
    return NULL;
}

LOIP_API int loip_heartbeat_new(loip_net *n, const char *endpoint, loip_heartbeat **out) {
    *out = NULL;
    loip_heartbeat *hb = calloc(1, sizeof *hb);
    if (!hb) return loip_fail(LOIP_ENOMEM, "heartbeat: out of memory");
    int rc = loip_sock_bind(n, endpoint, &hb->sock);
    if (rc) {
        free(hb);
        return rc;
    }
    hb->sock->thread_owned = 1;
    if (pthread_create(&hb->thread, NULL, heartbeat_main, hb) != 0) {
        loip_sock_free(hb->sock);
        free(hb);
        return loip_fail(LOIP_ENOMEM, "heartbeat: cannot start its thread");
    }
    *out = hb;
    return LOIP_OK;
}

LOIP_API void loip_heartbeat_free(loip_heartbeat *hb) {
    if (!hb) return;
    atomic_store(&hb->stop, 1);
    pthread_join(hb->thread, NULL);
    loip_sock_free(hb->sock);
    free(hb);
}

LOIP_API int loip_heartbeat_endpoint(loip_heartbeat *hb, char *buf, size_t cap) {
    snprintf(buf, cap, "%s", hb->sock->endpoint);
    return LOIP_OK;
}

LOIP_API uint64_t loip_heartbeat_last_ping(loip_heartbeat *hb) {
    return hb ? atomic_load(&hb->last_ping) : 0;
}

LOIP_API void loip_heartbeat_busy(loip_heartbeat *hb, int32_t busy) {
    if (!hb) return;
    if (busy) {
        atomic_store(&hb->busy_since, loip_now_ns());
    } else {
        atomic_store(&hb->busy_since, 0);
        atomic_fetch_add(&hb->done, 1);
    }
}

