/* The transport's threads: a client thread and the server exchanging messages over a net
 * with a cluster token (its ZAP handler thread checks every peer's key), a heartbeat thread
 * answering pings while another thread marks the device busy and idle, a stranger's key
 * refused. Loopback TCP only (nothing in /tmp). Under -DLOIP_SANITIZE=thread this
 * is the transport's ThreadSanitizer test (tests/tsan.supp: libzmq is not instrumented). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "loip.h"

enum { ROUNDS = 200 };

static loip_msg_header header(int kind, uint64_t step, uint64_t bytes) {
    loip_msg_header h;
    memset(&h, 0, sizeof h);
    h.kind = (uint16_t)kind;
    h.hop = -1;
    h.step = step;
    h.dtype = -1;
    h.payload_bytes = bytes;
    return h;
}

struct client_args {
    loip_net *net;
    char endpoint[128];
    int ok;
};

/* The client thread: ROUNDS requests, each answered with its step and its text reversed. */
static void *client_main(void *p) {
    struct client_args *a = p;
    loip_sock *s = NULL;
    if (loip_sock_connect(a->net, a->endpoint, "client", &s) != 0) return NULL;
    int ok = 1;
    for (int i = 0; i < ROUNDS && ok; i++) {
        char text[32], back[64];
        int n = snprintf(text, sizeof text, "message %d", i);
        loip_msg_header h = header(LOIP_MSG_STATS, (uint64_t)i, (uint64_t)n);
        ok = loip_sock_send(s, NULL, &h, text, 5000) == 0;
        loip_msg_header r;
        ok = ok && loip_sock_recv(s, 5000, &r, back, sizeof back, NULL) == 0;
        ok = ok && r.step == (uint64_t)i && r.payload_bytes == (uint64_t)n;
        for (int k = 0; ok && k < n; k++) ok = back[k] == text[n - 1 - k];
    }
    loip_sock_free(s);
    a->ok = ok;
    return NULL;
}

struct busy_args {
    loip_heartbeat *hb;
    atomic_int stop;
    int marks;
};

/* A device's main thread as the heartbeat sees it: messages starting and ending. */
static void *busy_main(void *p) {
    struct busy_args *a = p;
    while (!atomic_load(&a->stop)) {
        loip_heartbeat_busy(a->hb, 1);
        loip_heartbeat_busy(a->hb, 0);
        a->marks++;
    }
    return NULL;
}

static void test_messages_between_threads(loip_net *net) {
    loip_sock *server = NULL;
    CHECK(loip_sock_bind(net, "tcp://127.0.0.1:*", &server) == 0, "bind: %s", loip_last_error());
    if (!server) return;
    struct client_args a = {.net = net, .ok = 0};
    loip_sock_endpoint(server, a.endpoint, sizeof a.endpoint);
    pthread_t t;
    pthread_create(&t, NULL, client_main, &a);
    int served = 0;
    for (int i = 0; i < ROUNDS; i++) {
        char buf[64], from[64], out[64];
        loip_msg_header h;
        if (loip_sock_recv(server, 5000, &h, buf, sizeof buf, from) != 0) break;
        size_t n = (size_t)h.payload_bytes;
        for (size_t k = 0; k < n; k++) out[k] = buf[n - 1 - k];
        loip_msg_header r = header(LOIP_MSG_STATS, h.step, n);
        if (loip_sock_send(server, from, &r, out, 5000) != 0) break;
        served++;
    }
    pthread_join(t, NULL);
    CHECK(served == ROUNDS, "served %d of %d requests", served, ROUNDS);
    CHECK(a.ok, "the client got every answer, right");
    loip_sock_free(server);
}

static void test_heartbeat_while_busy(loip_net *net) {
    loip_heartbeat *hb = NULL;
    CHECK(loip_heartbeat_new(net, "tcp://127.0.0.1:*", &hb) == 0, "heartbeat: %s", loip_last_error());
    if (!hb) return;
    CHECK(loip_heartbeat_last_ping(hb) == 0, "no PING yet: no time");
    char ep[128];
    loip_heartbeat_endpoint(hb, ep, sizeof ep);
    struct busy_args b = {.hb = hb};
    pthread_t t;
    pthread_create(&t, NULL, busy_main, &b);
    loip_sock *s = NULL;
    loip_sock_connect(net, ep, "pinger", &s);
    int pongs = 0;
    uint64_t done_last = 0;
    int monotonic = 1;
    for (int i = 0; i < 50 && s; i++) {
        loip_msg_header h = header(LOIP_MSG_PING, (uint64_t)i, 0), r;
        uint64_t reply[2] = {0, 0};
        if (loip_sock_send(s, NULL, &h, NULL, 5000) != 0) break;
        if (loip_sock_recv(s, 5000, &r, reply, sizeof reply, NULL) != 0 || r.kind != LOIP_MSG_PONG) break;
        if (reply[1] < done_last) monotonic = 0;
        done_last = reply[1];
        pongs++;
    }
    atomic_store(&b.stop, 1);
    pthread_join(t, NULL);
    CHECK(pongs == 50, "%d of 50 pings answered while the device is busy", pongs);
    CHECK(monotonic, "the count of finished messages never goes back");
    uint64_t last = loip_heartbeat_last_ping(hb);
    CHECK(last > 0 && last <= loip_now_ns(), "the last PING's time is kept (%llu)", (unsigned long long)last);
    loip_sock_free(s);
    loip_heartbeat_free(hb);
}

static void test_stranger_refused(loip_net *net) {
    loip_sock *server = NULL;
    loip_sock_bind(net, "tcp://127.0.0.1:*", &server);
    char ep[128];
    loip_sock_endpoint(server, ep, sizeof ep);
    loip_net *other = NULL;
    CHECK(loip_net_new("another token", NULL, &other) == 0, "net: %s", loip_last_error());
    loip_sock *s = NULL;
    loip_sock_connect(other, ep, "stranger", &s);
    loip_msg_header h = header(LOIP_MSG_HELLO, 1, 0), r;
    loip_sock_send(s, NULL, &h, NULL, 1000);
    char buf[64], from[64];
    CHECK(loip_sock_recv(server, 500, &r, buf, sizeof buf, from) == LOIP_ETIMEDOUT, "the stranger's message never arrives");
    char log[4096];
    /* the stranger's socket counts the refusals (the server's monitor logs most of them too,
     * read by loip_net_auth_log as the server receives: not every one, so not checked) */
    int refused = 0;
    for (int i = 0; i < 1500 && refused == 0; i++) { /* (30 s at most: a busy machine refuses late, not never) */
        (void)loip_net_auth_log(net, log, sizeof log); /* (the other thread's lines, read: TSan sees both sides) */
        refused = loip_sock_refused(s);
        loip_sock_recv(server, 20, &r, buf, sizeof buf, from);
    }
    CHECK(refused > 0, "the stranger's socket was refused");
    loip_sock_free(s);
    loip_net_free(other);
    loip_sock_free(server);
}

int main(void) {
    loip_net *net = NULL;
    CHECK(loip_net_new("the cluster token", NULL, &net) == 0, "net: %s", loip_last_error());
    if (net) {
        test_messages_between_threads(net);
        test_heartbeat_while_busy(net);
        test_stranger_refused(net);
        loip_net_free(net);
    }
    printf("test_transport: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
