/* The transport's context and its authentication: CURVE everywhere. With a cluster token every
 * member derives the same keypair from it (secret = SHA-256 of a label and the token), so the
 * token itself never crosses the wire and a peer without it cannot complete a handshake; with a
 * keys directory the keys come from files. A ZAP handler (RFC 27), on its own thread in the
 * context, accepts only the cluster's public key (or the authorized ones) and logs every
 * refusal. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "core/core.h"
#include "transport/net.h"

/* ---- authentication ---------------------------------------------------------------------- */

void loip_auth_log(loip_net *n, const char *fmt, ...) {
    pthread_mutex_lock(&n->mu);
    if (n->n_log < AUTH_LOG_LINES) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(n->log[n->n_log++], sizeof n->log[0], fmt, ap);
        va_end(ap);
    } else {
        n->dropped_log++;
    }
    pthread_mutex_unlock(&n->mu);
}

/* One frame of a ZAP request into buf (NUL-terminated, truncated); its size. */
static int zap_frame(void *z, char *buf, size_t cap, int *more) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    int rc = zmq_msg_recv(&m, z, 0);
    if (rc < 0) {
        zmq_msg_close(&m);
        return -1;
    }
    size_t n = zmq_msg_size(&m) < cap - 1 ? zmq_msg_size(&m) : cap - 1;
    loip_zmsg_copy(buf, &m, n);
    buf[n] = 0;
    *more = zmq_msg_more(&m);
    zmq_msg_close(&m);
    return rc;
}

static void *zap_main(void *arg) {
    loip_net *n = arg;
    void *z = n->zap_ready;
    for (;;) {
        char f[8][256];
        int sizes[8], more = 1, k = 0;
        while (more && k < 8) {
            sizes[k] = zap_frame(z, f[k], sizeof f[k], &more);
            if (sizes[k] < 0) {
                if (zmq_errno() == ETERM) goto done;
                more = 0;
                break;
            }
            k++;
        }
        while (more) { /* drain frames past 8 */
            char junk[8];
            if (zap_frame(z, junk, sizeof junk, &more) < 0) break;
        }
        if (k < 6) continue;
        /* frames: version, request id, domain, address, identity, mechanism, credentials */
        const char *mech = f[5], *address = f[3];
        int ok = 0;
        if (!strcmp(mech, "CURVE") && k >= 7 && sizes[6] == 32) {
            for (int i = 0; i < n->n_allowed && !ok; i++) ok = !memcmp(f[6], n->allowed[i], 32);
            if (!ok) {
                char key[41];
                zmq_z85_encode(key, (const uint8_t *)f[6], 32);
                loip_auth_log(n, "rejected a peer from %s: unknown key %s (wrong cluster token or keys)", address, key);
            }
        } else {
            loip_auth_log(n, "rejected a peer from %s: mechanism %s (CURVE required)", address, mech);
        }
        const char *status = ok ? "200" : "400", *text = ok ? "OK" : "unknown peer";
        zmq_send(z, "1.0", 3, ZMQ_SNDMORE);
        zmq_send(z, f[1], (size_t)sizes[1], ZMQ_SNDMORE);
        zmq_send(z, status, 3, ZMQ_SNDMORE);
        zmq_send(z, text, strlen(text), ZMQ_SNDMORE);
        zmq_send(z, "", 0, ZMQ_SNDMORE);
        zmq_send(z, "", 0, 0);
    }
done:
    zmq_close(z);
    return NULL;
}

static int read_key(const char *path, char *z85) {
    FILE *f = fopen(path, "r");
    if (!f) return loip_fail(LOIP_EINVAL, "%s: cannot open: %s", path, strerror(errno));
    char line[128] = {0};
    if (!fgets(line, sizeof line, f)) line[0] = 0;
    fclose(f);
    size_t len = strcspn(line, " \t\r\n");
    line[len] = 0;
    uint8_t raw[32];
    if (len != 40 || !zmq_z85_decode(raw, line))
        return loip_fail(LOIP_EINVAL, "%s: not a CURVE key (40 z85 characters)", path);
    memcpy(z85, line, 41);
    return LOIP_OK;
}

LOIP_API int loip_net_new(const char *token, const char *keys_dir, loip_net **out) {
    *out = NULL;
    if ((!token || !*token) && !keys_dir)
        return loip_fail(LOIP_EINVAL, "transport: a cluster token or a keys directory is required "
                                      "(peers must authenticate)");
    if (!zmq_has("curve"))
        return loip_fail(LOIP_ENOSYS, "transport: this libzmq has no CURVE support (built without libsodium)");
    loip_net *n = calloc(1, sizeof *n);
    if (!n) return loip_fail(LOIP_ENOMEM, "transport: out of memory");
    pthread_mutex_init(&n->mu, NULL);
    int rc = LOIP_OK;
    if (token && *token) {
        /* secret = SHA-256("loip cluster key v1\0" || token): the same for every member */
        loip_sha256 *h;
        uint8_t secret[32], pub[32];
        if ((rc = loip_sha256_new(&h))) goto fail;
        static const char label[] = "loip cluster key v1";
        loip_sha256_update(h, label, sizeof label);
        loip_sha256_update(h, token, strlen(token));
        loip_sha256_final(h, secret, NULL);
        loip_sha256_free(h);
        zmq_z85_encode(n->secret_z85, secret, 32);
        if (zmq_curve_public(n->public_z85, n->secret_z85) != 0) {
            rc = loip_zfail(LOIP_ENOSYS, "transport: deriving the public key");
            goto fail;
        }
        zmq_z85_decode(pub, n->public_z85);
        memcpy(n->allowed[n->n_allowed++], pub, 32);
    } else {
        char path[4096];
        snprintf(path, sizeof path, "%s/secret.key", keys_dir);
        if ((rc = read_key(path, n->secret_z85))) goto fail;
        if (zmq_curve_public(n->public_z85, n->secret_z85) != 0) {
            rc = loip_zfail(LOIP_ENOSYS, "transport: deriving the public key");
            goto fail;
        }
        uint8_t pub[32];
        zmq_z85_decode(pub, n->public_z85);
        memcpy(n->allowed[n->n_allowed++], pub, 32);
    }
    if (!(n->ctx = zmq_ctx_new())) {
        rc = loip_zfail(LOIP_ENOMEM, "transport: zmq context");
        goto fail;
    }
    n->zap_ready = zmq_socket(n->ctx, ZMQ_REP);
    if (!n->zap_ready || zmq_bind(n->zap_ready, ZAP_ENDPOINT) != 0) {
        rc = loip_zfail(LOIP_EINVAL, "transport: ZAP handler");
        goto fail;
    }
    if (pthread_create(&n->zap_thread, NULL, zap_main, n) != 0) {
        rc = loip_fail(LOIP_ENOMEM, "transport: cannot start the ZAP thread");
        goto fail;
    }
    n->zap_ok = 1;
    *out = n;
    return LOIP_OK;
fail:
    if (n->zap_ready && !n->zap_ok) zmq_close(n->zap_ready);
    if (n->ctx) zmq_ctx_term(n->ctx);
    free(n);
    return rc ? rc : LOIP_EINVAL;
}

LOIP_API void loip_net_free(loip_net *n) {
    if (!n) return;
    /* ctx_term blocks until every socket is closed. Sockets belong to the caller, who should
     * free them first; any still open (a program that stopped on an error, finalizers run in
     * any order) are closed here, with linger 0, and stay as husks their owner frees later.
     * A heartbeat thread's socket is closed by its thread on ETERM; the ZAP thread exits on
     * ETERM too. */
    pthread_mutex_lock(&n->mu);
    for (loip_sock *s = n->socks; s; s = s->next) {
        if (!s->thread_owned) loip_sock_close_z(s);
        s->net = NULL;
    }
    n->socks = NULL;
    pthread_mutex_unlock(&n->mu);
    zmq_ctx_shutdown(n->ctx);
    if (n->zap_ok) pthread_join(n->zap_thread, NULL);
    zmq_ctx_term(n->ctx);
    pthread_mutex_destroy(&n->mu);
    free(n);
}

LOIP_API int loip_net_auth_log(loip_net *n, char *buf, size_t cap) {
    pthread_mutex_lock(&n->mu);
    size_t at = 0;
    int k = 0;
    if (cap) buf[0] = 0;
    while (k < n->n_log) {
        size_t len = strlen(n->log[k]);
        if (at + len + 2 > cap) break;
        memcpy(buf + at, n->log[k], len);
        at += len;
        buf[at++] = '\n';
        buf[at] = 0;
        k++;
    }
    memmove(n->log, n->log + k, (size_t)(n->n_log - k) * sizeof n->log[0]);
    n->n_log -= k;
    pthread_mutex_unlock(&n->mu);
    return k;
}

