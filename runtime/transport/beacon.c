/* UDP broadcast beacons over CZMQ's zbeacon actor (discovery on a LAN).
 *
 * Why zbeacon rather than DNS-SD through Avahi: no daemon and no D-Bus on the boards, made for
 * ZeroMQ applications (our transport is ZeroMQ), and plain UDP broadcast works inside the
 * testbed's network namespaces over their bridge. The actor runs its own thread; this file
 * only sends it commands and reads what it heard (pull: nothing calls back into Lua). What a
 * payload means (fields, proof) is decided in Lua: lua/loip/cluster/discovery.lua. */
#include <czmq.h>
#include <stdio.h>
#include <string.h>

#include "core/core.h"
#include "core/runtime.h"

struct loip_beacon {
    zactor_t *actor; /* zbeacon */
    char host[64];   /* the address zbeacon chose ("*": all interfaces) */
};

static void czmq_once(void) {
    /* CZMQ would otherwise install its own SIGINT/SIGTERM handlers over loip's
     * (runtime/process/signal.c): a worker must still stop cleanly on SIGTERM. */
    static int done;
    if (done) return;
    done = 1;
    zsys_handler_set(NULL);
}

LOIP_API int loip_beacon_new(int32_t port, const char *iface, loip_beacon **out) {
    *out = NULL;
    if (port <= 0 || port > 65535) return loip_fail(LOIP_EINVAL, "beacon: port %d is not 1..65535", port);
    czmq_once();
    if (iface && *iface) zsys_set_interface(iface);
    loip_beacon *b = calloc(1, sizeof *b);
    if (!b) return loip_fail(LOIP_ENOMEM, "beacon: out of memory");
    b->actor = zactor_new(zbeacon, NULL);
    if (!b->actor) {
        free(b);
        return loip_fail(LOIP_EIO, "beacon: cannot start zbeacon");
    }
    zsock_send(b->actor, "si", "CONFIGURE", (int)port);
    char *host = zstr_recv(b->actor);
    if (!host || !*host) {
        zstr_free(&host);
        zactor_destroy(&b->actor);
        free(b);
        return loip_fail(LOIP_EIO, "beacon: no interface for UDP broadcast on port %d%s%s", port,
                         iface && *iface ? " on " : "", iface && *iface ? iface : "");
    }
    snprintf(b->host, sizeof b->host, "%s", host);
    zstr_free(&host);
    *out = b;
    return LOIP_OK;
}

LOIP_API void loip_beacon_free(loip_beacon *b) {
    if (!b) return;
    zactor_destroy(&b->actor);
    free(b);
}

LOIP_API int loip_beacon_host(loip_beacon *b, char *host, size_t cap) {
    snprintf(host, cap, "%s", b->host);
    return LOIP_OK;
}

LOIP_API int loip_beacon_publish(loip_beacon *b, const void *payload, int32_t len, int32_t interval_ms) {
    if (len <= 0 || len > LOIP_BEACON_MAX)
        return loip_fail(LOIP_EINVAL, "beacon: a payload of %d bytes (1..%d)", len, LOIP_BEACON_MAX);
    if (interval_ms <= 0) return loip_fail(LOIP_EINVAL, "beacon: interval %d ms", interval_ms);
    zsock_send(b->actor, "sbi", "PUBLISH", payload, (size_t)len, (int)interval_ms);
    return LOIP_OK;
}

LOIP_API int loip_beacon_silence(loip_beacon *b) {
    zstr_sendx(b->actor, "SILENCE", NULL);
    return LOIP_OK;
}

LOIP_API int loip_beacon_subscribe(loip_beacon *b, const void *prefix, int32_t len) {
    if (len < 0 || len > LOIP_BEACON_MAX) return loip_fail(LOIP_EINVAL, "beacon: a prefix of %d bytes", len);
    zsock_send(b->actor, "sb", "SUBSCRIBE", prefix, (size_t)len);
    return LOIP_OK;
}

LOIP_API int loip_beacon_recv(loip_beacon *b, int32_t timeout_ms, char *addr, size_t cap,
                              uint8_t *payload, int32_t *len) {
    zsock_set_rcvtimeo(b->actor, timeout_ms < 0 ? -1 : timeout_ms);
    zmsg_t *msg = zmsg_recv(b->actor);
    if (!msg) return 0; /* timed out (or interrupted) */
    char *from = zmsg_popstr(msg);
    zframe_t *body = zmsg_pop(msg);
    int rc = 1;
    if (!from || !body) {
        rc = loip_fail(LOIP_EPROTO, "beacon: a malformed message from zbeacon");
    } else {
        size_t n = zframe_size(body);
        if (n > LOIP_BEACON_MAX) n = LOIP_BEACON_MAX;
        memcpy(payload, zframe_data(body), n);
        *len = (int32_t)n;
        snprintf(addr, cap, "%s", from);
    }
    zstr_free(&from);
    zframe_destroy(&body);
    zmsg_destroy(&msg);
    return rc;
}
