/* The transport: authenticated ZeroMQ sockets (auth.c) carrying framed, checked messages.
 *
 * A message is two frames: the 64-byte header and the payload (absent when empty). Receiving
 * checks every header field against the frame sizes; a bad message is drained whole and
 * reported, so the socket stays in step. Link emulation is applied on receipt: the message is
 * delivered when a serial wire of the given rate, busy with the earlier messages, would have
 * carried it, plus the one-way delay (the kernel here has no netem). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "core/core.h"
#include "transport/net.h"

/* Under ThreadSanitizer: libzmq is not instrumented, and a message it received on its I/O
 * thread reaches ours through its lock-free pipes, which TSan cannot see; reading the bytes of
 * a message libzmq handed us is no race (tests/tsan.supp covers libzmq's own code). */
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LOIP_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define LOIP_TSAN 1
#endif
#ifdef LOIP_TSAN
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
#endif


/* n bytes of a message libzmq received into dst. */
void loip_zmsg_copy(void *dst, zmq_msg_t *m, size_t n) {
#ifdef LOIP_TSAN
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
#endif
    memcpy(dst, zmq_msg_data(m), n);
#ifdef LOIP_TSAN
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#endif
}


int loip_zfail(int code, const char *what) {
    return loip_fail(code, "%s: %s", what, zmq_strerror(zmq_errno()));
}

void loip_sock_close_z(loip_sock *s) {
    if (s->mon) {
        zmq_socket_monitor(s->z, NULL, 0);
        zmq_close(s->mon);
        s->mon = NULL;
    }
    if (s->z) zmq_close(s->z);
    s->z = NULL;
}

/* ---- sockets ----------------------------------------------------------------------------- */

static int sock_new(loip_net *n, int type, loip_sock **out) {
    loip_sock *s = calloc(1, sizeof *s);
    if (!s) return loip_fail(LOIP_ENOMEM, "transport: out of memory");
    s->net = n;
    s->weight = 1.0; /* C decides nothing: the last sample, until the caller smooths */
    if (!(s->z = zmq_socket(n->ctx, type))) {
        free(s);
        return loip_zfail(LOIP_EINVAL, "transport: socket");
    }
    int linger = 0, hwm = 64;
    zmq_setsockopt(s->z, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s->z, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s->z, ZMQ_RCVHWM, &hwm, sizeof hwm);
    pthread_mutex_lock(&n->mu);
    s->next = n->socks;
    if (n->socks) n->socks->prev = s;
    n->socks = s;
    pthread_mutex_unlock(&n->mu);
    *out = s;
    return LOIP_OK;
}

LOIP_API void loip_sock_free(loip_sock *s) {
    if (!s) return;
    loip_net *n = s->net;
    if (n) {
        pthread_mutex_lock(&n->mu);
        if (s->prev) s->prev->next = s->next;
        else n->socks = s->next;
        if (s->next) s->next->prev = s->prev;
        pthread_mutex_unlock(&n->mu);
    }
    loip_sock_close_z(s);
    free(s);
}

/* A socket whose net was freed under it is closed: every use is refused. */
#define CHECK_OPEN(s) do { if (!(s)->z) return loip_fail(LOIP_ESTATE, "transport: the socket was closed with its context"); } while (0)

/* Failed handshakes on a server socket (a client with another token or key fails inside the
 * CURVE handshake, before the ZAP handler sees it): into the net's refusal log. */
static void poll_monitor(loip_sock *s) {
    if (!s->mon) return;
    for (;;) {
        zmq_msg_t ev, addr;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, s->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return;
        }
        uint16_t event = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&ev) >= 6) {
            uint8_t raw[6];
            loip_zmsg_copy(raw, &ev, sizeof raw);
            memcpy(&event, raw, 2);
            memcpy(&value, raw + 2, 4);
        }
        int more = zmq_msg_more(&ev);
        zmq_msg_close(&ev);
        char where[256] = "";
        if (more) {
            zmq_msg_init(&addr);
            if (zmq_msg_recv(&addr, s->mon, 0) >= 0) {
                size_t n = zmq_msg_size(&addr) < sizeof where - 1 ? zmq_msg_size(&addr) : sizeof where - 1;
                loip_zmsg_copy(where, &addr, n);
                where[n] = 0;
            }
            zmq_msg_close(&addr);
        }
        if (!s->server) {
            if (event == ZMQ_EVENT_CONNECTED) s->connected = 1;
            else if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) s->handshaken = 1, s->refused = 0;
            else if (event == ZMQ_EVENT_DISCONNECTED && s->connected && !s->handshaken) s->refused++;
            else if (event & (ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                              ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)) s->refused++;
            if (event == ZMQ_EVENT_DISCONNECTED) s->connected = 0;
            continue;
        }
        const char *why = event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ? "authentication refused"
                          : event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ? "CURVE handshake failed (wrong cluster token or keys?)"
                                                                          : "handshake failed";
        loip_net *n = s->net; /* (valid while this socket is open: the net's ctx_term waits for it) */
        if (n) loip_auth_log(n, "rejected a peer on %s: %s (code %u)", where[0] ? where : s->endpoint, why, value);
    }
}

LOIP_API int loip_sock_bind(loip_net *n, const char *endpoint, loip_sock **out) {
    *out = NULL;
    loip_sock *s;
    int rc = sock_new(n, ZMQ_ROUTER, &s);
    if (rc) return rc;
    s->server = 1;
    int one = 1;
    zmq_setsockopt(s->z, ZMQ_CURVE_SERVER, &one, sizeof one);
    zmq_setsockopt(s->z, ZMQ_CURVE_SECRETKEY, n->secret_z85, 40);
    zmq_setsockopt(s->z, ZMQ_ZAP_DOMAIN, "loip", 4);
    /* a peer that reconnects under the same identity takes it over (a restarted worker) */
    zmq_setsockopt(s->z, ZMQ_ROUTER_HANDOVER, &one, sizeof one);
    /* sending to an identity that is not connected is an error, not a silent drop */
    zmq_setsockopt(s->z, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    if (zmq_bind(s->z, endpoint) != 0) {
        rc = loip_fail(LOIP_EINVAL, "cannot listen at %s: %s", endpoint, zmq_strerror(zmq_errno()));
        loip_sock_free(s);
        return rc;
    }
    size_t len = sizeof s->endpoint;
    zmq_getsockopt(s->z, ZMQ_LAST_ENDPOINT, s->endpoint, &len);
    char mon[64];
    snprintf(mon, sizeof mon, "inproc://loip-monitor-%p", (void *)s);
    if (zmq_socket_monitor(s->z, mon, ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                           ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) == 0 &&
        (s->mon = zmq_socket(n->ctx, ZMQ_PAIR)) && zmq_connect(s->mon, mon) != 0) {
        zmq_close(s->mon);
        s->mon = NULL;
    }
    *out = s;
    return LOIP_OK;
}

LOIP_API int loip_sock_endpoint(loip_sock *s, char *buf, size_t cap) {
    CHECK_OPEN(s);
    size_t len = cap;
    if (zmq_getsockopt(s->z, ZMQ_LAST_ENDPOINT, buf, &len) != 0) return loip_zfail(LOIP_EINVAL, "transport: endpoint");
    return LOIP_OK;
}

LOIP_API int loip_sock_connect(loip_net *n, const char *endpoint, const char *identity, loip_sock **out) {
    *out = NULL;
    if (!identity || !*identity || strlen(identity) >= 64)
        return loip_fail(LOIP_EINVAL, "transport: identity must be 1-63 bytes");
    loip_sock *s;
    int rc = sock_new(n, ZMQ_DEALER, &s);
    if (rc) return rc;
    zmq_setsockopt(s->z, ZMQ_ROUTING_ID, identity, strlen(identity));
    zmq_setsockopt(s->z, ZMQ_CURVE_SERVERKEY, n->public_z85, 40);
    zmq_setsockopt(s->z, ZMQ_CURVE_PUBLICKEY, n->public_z85, 40);
    zmq_setsockopt(s->z, ZMQ_CURVE_SECRETKEY, n->secret_z85, 40);
    char mon[64];
    snprintf(mon, sizeof mon, "inproc://loip-monitor-%p", (void *)s);
    if (zmq_socket_monitor(s->z, mon, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                           ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                           ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) == 0 &&
        (s->mon = zmq_socket(n->ctx, ZMQ_PAIR)) && zmq_connect(s->mon, mon) != 0) {
        zmq_close(s->mon);
        s->mon = NULL;
    }
    int ivl = 100, max_ivl = 1000;
    zmq_setsockopt(s->z, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    zmq_setsockopt(s->z, ZMQ_RECONNECT_IVL_MAX, &max_ivl, sizeof max_ivl);
    if (zmq_connect(s->z, endpoint) != 0) {
        rc = loip_fail(LOIP_EINVAL, "cannot connect to %s: %s", endpoint, zmq_strerror(zmq_errno()));
        loip_sock_free(s);
        return rc;
    }
    *out = s;
    return LOIP_OK;
}

LOIP_API int loip_sock_refused(loip_sock *s) {
    if (!s->z) return 0;
    poll_monitor(s);
    return s->refused;
}

static int set_timeout(void *z, int opt, int32_t ms) {
    int v = ms < 0 ? -1 : ms;
    return zmq_setsockopt(z, opt, &v, sizeof v);
}

LOIP_API int loip_sock_send(loip_sock *s, const char *to, const loip_msg_header *h,
                            const void *payload, int32_t timeout_ms) {
    CHECK_OPEN(s);
    loip_msg_header hh = *h;
    hh.magic = LOIP_MSG_MAGIC;
    hh.version = LOIP_MSG_VERSION;
    hh.t_send_ns = loip_now_ns();
    if (hh.payload_bytes && !payload) return loip_fail(LOIP_EINVAL, "send: payload missing");
    set_timeout(s->z, ZMQ_SNDTIMEO, timeout_ms);
    int more = hh.payload_bytes ? ZMQ_SNDMORE : 0;
    if (s->server) {
        if (!to || !*to) return loip_fail(LOIP_EINVAL, "send: a server socket needs the peer's identity");
        if (zmq_send(s->z, to, strlen(to), ZMQ_SNDMORE) < 0) goto fail;
    }
    if (zmq_send(s->z, &hh, sizeof hh, more) < 0) goto fail;
    if (more && zmq_send(s->z, payload, hh.payload_bytes, 0) < 0) goto fail;
    return LOIP_OK;
fail:
    if (zmq_errno() == EAGAIN)
        return loip_fail(LOIP_ETIMEDOUT, "send to %s: not accepted within %d ms", to ? to : "server", timeout_ms);
    if (zmq_errno() == EHOSTUNREACH) return loip_fail(LOIP_EIO, "send: %s is not connected", to ? to : "peer");
    return loip_zfail(LOIP_EIO, "send");
}

static peer *peer_of(loip_sock *s, const char *id) {
    for (int i = 0; i < s->n_peers; i++)
        if (!strcmp(s->peers[i].id, id)) return &s->peers[i];
    if (s->n_peers == MAX_PEERS) return NULL;
    peer *p = &s->peers[s->n_peers++];
    memset(p, 0, sizeof *p);
    snprintf(p->id, sizeof p->id, "%s", id);
    snprintf(p->st.peer, sizeof p->st.peer, "%s", id);
    return p;
}

static void drain(void *z) {
    int more = 1;
    size_t len = sizeof more;
    while (zmq_getsockopt(z, ZMQ_RCVMORE, &more, &len) == 0 && more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        zmq_msg_recv(&m, z, 0);
        zmq_msg_close(&m);
        len = sizeof more;
    }
}

LOIP_API int loip_msg_check(const loip_msg_header *h, uint64_t cap, const char *who) {
    if (!who) who = "peer";
#define BAD(...) return loip_fail(LOIP_EPROTO, __VA_ARGS__)
    if (h->magic != LOIP_MSG_MAGIC) BAD("message from %s: bad magic 0x%08x (not a loip peer)", who, h->magic);
    if (h->version != LOIP_MSG_VERSION)
        BAD("message from %s: protocol version %u, this loip speaks %d", who, h->version, LOIP_MSG_VERSION);
    if (h->kind == 0 || h->kind >= LOIP_MSG_KINDS) BAD("message from %s: unknown kind %u", who, h->kind);
    if (h->payload_bytes > cap)
        BAD("message from %s: payload of %llu bytes exceeds %llu", who, (unsigned long long)h->payload_bytes,
            (unsigned long long)cap);
    if (h->kind == LOIP_MSG_TOKENS || h->kind == LOIP_MSG_HIDDEN) {
        /* n_tokens x dim elements, then the n_tokens loip_step_token of the micro-batch */
        int32_t want = h->kind == LOIP_MSG_HIDDEN ? LOIP_F32 : LOIP_I32;
        if (h->dtype != want) BAD("message from %s: dtype %d not allowed for kind %u", who, h->dtype, h->kind);
        /* (bounded: no micro-batch comes near 2^24 tokens or a 2^24-wide hidden state) */
        if (h->n_tokens <= 0 || h->dim <= 0 || h->pos < 0 || h->n_tokens > (1 << 24) || h->dim > (1 << 24))
            BAD("message from %s: n_tokens %d, dim %d, pos %d", who, h->n_tokens, h->dim, h->pos);
        if ((uint64_t)h->n_tokens * ((uint64_t)h->dim * 4 + sizeof(loip_step_token)) != h->payload_bytes)
            BAD("message from %s: payload of %llu bytes but n_tokens %d x (dim %d x 4 + %zu) bytes", who,
                (unsigned long long)h->payload_bytes, h->n_tokens, h->dim, sizeof(loip_step_token));
    } else if (h->kind == LOIP_MSG_LOGITS) {
        /* pos rows of (model dim + dim) floats, then n_tokens loip_step_token (checked by the
         * device, which knows the model's dim) */
        uint64_t table = (uint64_t)h->n_tokens * sizeof(loip_step_token);
        if (h->dtype != LOIP_F32 || h->n_tokens <= 0 || h->n_tokens > (1 << 24) || h->pos <= 0 ||
            h->pos > h->n_tokens || h->dim <= 0 || h->dim > (1 << 28) ||
            table + (uint64_t)h->pos * h->dim * 4 > h->payload_bytes ||
            (h->payload_bytes - table) % ((uint64_t)h->pos * 4) != 0)
            BAD("message from %s: logits of %d rows of %d tokens, vocabulary %d (dtype %d) in %llu bytes", who,
                h->pos, h->n_tokens, h->dim, h->dtype, (unsigned long long)h->payload_bytes);
    } else if (h->kind == LOIP_MSG_RESULT) {
        /* n_tokens loip_step_output, then logits rows (checked by the head, which knows the vocabulary) */
        if (h->dtype != -1 || h->n_tokens < 0 ||
            (uint64_t)h->n_tokens * sizeof(loip_step_output) > h->payload_bytes)
            BAD("message from %s: a result of %d outputs (dtype %d) in %llu bytes", who, h->n_tokens, h->dtype,
                (unsigned long long)h->payload_bytes);
    }
#undef BAD
    return LOIP_OK;
}

static int sock_recv(loip_sock *s, int32_t timeout_ms, loip_msg_header *h, void *payload, uint64_t cap,
                     char *from, void **large);

LOIP_API int loip_sock_recv(loip_sock *s, int32_t timeout_ms, loip_msg_header *h, void *payload,
                            uint64_t cap, char *from) {
    return sock_recv(s, timeout_ms, h, payload, cap, from, NULL);
}

LOIP_API int loip_sock_recv_large(loip_sock *s, int32_t timeout_ms, loip_msg_header *h, void *payload,
                                  uint64_t cap, char *from, void **large) {
    *large = NULL;
    return sock_recv(s, timeout_ms, h, payload, cap, from, large);
}

/* A receive that returned nothing: the reason, as the caller's error. */
static int recv_failed(loip_sock *s, int32_t timeout_ms) {
    poll_monitor(s);
    if (zmq_errno() == EAGAIN) return loip_fail(LOIP_ETIMEDOUT, "receive: nothing within %d ms", timeout_ms);
    if (zmq_errno() == ETERM) return loip_fail(LOIP_ESTATE, "receive: the transport is shutting down");
    if (zmq_errno() == EINTR) return loip_fail(LOIP_ETIMEDOUT, "receive: interrupted by a signal");
    return loip_zfail(LOIP_EIO, "receive");
}

/* A server socket's first frame: the sender's identity, into id[64] (and from). */
static int recv_identity(loip_sock *s, int32_t timeout_ms, char *id, char *from) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s->z, 0) < 0) {
        zmq_msg_close(&m);
        return recv_failed(s, timeout_ms);
    }
    size_t n = zmq_msg_size(&m) < 63 ? zmq_msg_size(&m) : 63;
    loip_zmsg_copy(id, &m, n);
    id[n] = 0;
    zmq_msg_close(&m);
    if (from) snprintf(from, 64, "%s", id);
    return LOIP_OK;
}

/* The header frame, checked (loip_msg_check, with no payload limit for lent KV when the caller
 * takes large payloads): *t_recv when it came, *has_more whether a frame follows. */
static int recv_header(loip_sock *s, int32_t timeout_ms, const char *who, uint64_t cap, void **large,
                       loip_msg_header *h, uint64_t *t_recv, int *has_more) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s->z, 0) < 0) {
        zmq_msg_close(&m);
        return recv_failed(s, timeout_ms);
    }
    *t_recv = loip_now_ns();
    *has_more = zmq_msg_more(&m);
    int rc;
    if (zmq_msg_size(&m) != sizeof *h) {
        rc = loip_fail(LOIP_EPROTO, "message from %s: header of %zu bytes, expected %zu", who,
                       zmq_msg_size(&m), sizeof *h);
        zmq_msg_close(&m);
        drain(s->z);
        return rc;
    }
    loip_zmsg_copy(h, &m, sizeof *h);
    zmq_msg_close(&m);
    int kv = h->kind >= LOIP_MSG_KV_PUT && h->kind <= LOIP_MSG_KV_DROP;
    if ((rc = loip_msg_check(h, large && kv ? UINT64_MAX : cap, who))) drain(s->z);
    return rc;
}

/* The payload frame the header announced, into payload (cap bytes) or, larger, into a buffer
 * allocated for it (*large, the caller's to free); *got its size. */
static int recv_payload(loip_sock *s, int32_t timeout_ms, const char *who, const loip_msg_header *h,
                        int has_more, void *payload, uint64_t cap, void **large, uint64_t *got) {
    int rc;
#define BAD(...) do { rc = loip_fail(LOIP_EPROTO, __VA_ARGS__); drain(s->z); return rc; } while (0)
    *got = 0;
    if (!h->payload_bytes) {
        if (has_more) BAD("message from %s: a payload frame the header does not announce", who);
        return LOIP_OK;
    }
    if (!has_more) BAD("message from %s: header announces %llu payload bytes, none came", who,
                       (unsigned long long)h->payload_bytes);
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s->z, 0) < 0) {
        zmq_msg_close(&m);
        return recv_failed(s, timeout_ms);
    }
    *got = zmq_msg_size(&m);
    int extra = zmq_msg_more(&m);
    void *into = payload;
    if (*got == h->payload_bytes && *got > cap && !(into = *large = malloc(*got))) {
        zmq_msg_close(&m);
        drain(s->z);
        return loip_fail(LOIP_ENOMEM, "message from %s: no memory for a payload of %llu bytes", who,
                         (unsigned long long)*got);
    }
    if (*got == h->payload_bytes) loip_zmsg_copy(into, &m, *got);
    zmq_msg_close(&m);
    if (*got != h->payload_bytes || extra) {
        if (large && *large) free(*large), *large = NULL;
        BAD("message from %s: payload of %llu bytes, the header says %llu", who,
            (unsigned long long)*got, (unsigned long long)h->payload_bytes);
    }
#undef BAD
    return LOIP_OK;
}

/* Emulated link: a serial wire of rate bytes/s, free from wire_free, then the delay. Waits
 * until the message would have arrived (asleep, then spinning its last spin_ns) and returns
 * that time (t_recv when nothing is emulated). */
static uint64_t emulate_link(loip_sock *s, const loip_msg_header *h, uint64_t bytes, uint64_t t_recv) {
    if (!s->rate_bps && !s->delay_ns) return t_recv;
    /* lent KV moves while its receiver works (it takes it when it needs it): its wire starts at
     * the send, on the sender's clock when it is ours */
    int kv = h->kind >= LOIP_MSG_KV_PUT && h->kind <= LOIP_MSG_KV_DROP;
    uint64_t sent = kv && h->t_send_ns && h->t_send_ns <= t_recv ? h->t_send_ns : t_recv;
    uint64_t start = s->wire_free_ns > sent ? s->wire_free_ns : sent;
    uint64_t arrive = start + (s->rate_bps ? (uint64_t)((double)bytes / (double)s->rate_bps * 1e9) : 0);
    s->wire_free_ns = arrive;
    uint64_t deliver = arrive + s->delay_ns;
    uint64_t now = loip_now_ns();
    if (deliver > now && deliver - now > s->spin_ns) {
        uint64_t until = deliver - s->spin_ns;
        struct timespec ts = {(time_t)(until / 1000000000ull), (long)(until % 1000000000ull)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {}
    }
    while (loip_now_ns() < deliver) {}
    return deliver;
}

/* The sender's statistics: messages, bytes, emulated time, and (same-host clocks only: a
 * sender stamp from another machine's clock is meaningless) bandwidth or latency samples. */
static void record_peer(loip_sock *s, const char *id, const loip_msg_header *h, uint64_t bytes,
                        uint64_t t_recv, uint64_t deliver) {
    peer *p = peer_of(s, id);
    if (!p) return;
    p->st.messages++;
    p->st.bytes += bytes;
    p->st.emulated_ns += deliver - t_recv;
    uint64_t now = loip_now_ns();
    if (!h->t_send_ns || h->t_send_ns > now || now - h->t_send_ns >= 60ull * 1000000000ull) return;
    double dt = (double)(now - h->t_send_ns);
    if (bytes >= 64 * 1024) {
        double bw = (double)bytes / (dt / 1e9);
        p->st.bw_bps = p->st.bw_bps ? (1 - s->weight) * p->st.bw_bps + s->weight * bw : bw;
    } else {
        p->st.latency_ns = p->st.latency_ns ? (1 - s->weight) * p->st.latency_ns + s->weight * dt : dt;
        p->st.latency_sum_ns += now - h->t_send_ns;
        p->st.latency_count++;
        if (t_recv >= h->t_send_ns) p->st.transit_sum_ns += t_recv - h->t_send_ns;
        p->st.late_sum_ns += now - deliver;
    }
}

static int sock_recv(loip_sock *s, int32_t timeout_ms, loip_msg_header *h, void *payload, uint64_t cap,
                     char *from, void **large) {
    CHECK_OPEN(s);
    char id[64] = "";
    poll_monitor(s);
    set_timeout(s->z, ZMQ_RCVTIMEO, timeout_ms);
    int rc;
    if (s->server) {
        if ((rc = recv_identity(s, timeout_ms, id, from))) return rc;
    } else if (from) {
        from[0] = 0;
    }
    const char *who = id[0] ? id : "server";
    uint64_t t_recv = 0, got = 0;
    int has_more = 0;
    if ((rc = recv_header(s, timeout_ms, who, cap, large, h, &t_recv, &has_more))) return rc;
    if ((rc = recv_payload(s, timeout_ms, who, h, has_more, payload, cap, large, &got))) return rc;
    uint64_t bytes = sizeof *h + got;
    uint64_t deliver = emulate_link(s, h, bytes, t_recv);
    record_peer(s, id, h, bytes, t_recv, deliver);
    return LOIP_OK;
}

LOIP_API int loip_sock_emulate(loip_sock *s, uint64_t rate_bps, uint64_t delay_ns) {
    s->rate_bps = rate_bps;
    s->delay_ns = delay_ns;
    s->wire_free_ns = 0;
    return LOIP_OK;
}

LOIP_API int loip_sock_emulate_spin(loip_sock *s, uint64_t spin_ns) {
    s->spin_ns = spin_ns;
    return LOIP_OK;
}

LOIP_API int loip_sock_smoothing(loip_sock *s, double weight) {
    if (!(weight > 0.0 && weight <= 1.0)) /* NaN too */
        return loip_fail(LOIP_EINVAL, "transport: smoothing weight %g is not in (0, 1]", weight);
    s->weight = weight;
    return LOIP_OK;
}

LOIP_API int loip_sock_stats(loip_sock *s, loip_link_stats *out, int32_t cap) {
    int k = 0;
    for (; k < s->n_peers && k < cap; k++) out[k] = s->peers[k].st;
    return k;
}

