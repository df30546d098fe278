/* The HTTP front of `loip serve` (libmicrohttpd): C receives requests and writes responses,
 * Lua decides what they mean. Each connection has its own thread (MHD's thread per
 * connection): it reads the body (up to max_body bytes), puts the request in a queue for the
 * caller's loop (loip_http_next), and waits until the caller answers it, either whole
 * (loip_http_respond) or as a stream of chunks (loip_http_stream_*: server-sent events) that the
 * connection's thread writes as they come. While it waits it watches its socket: a client that
 * hangs up marks the request cancelled (loip_http_cancelled), so that the caller can stop the
 * work and free what it held. A request is freed when both sides are done with it. */
#define _GNU_SOURCE /* POLLRDHUP */
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "core/core.h"

enum { WAITING = 0, ANSWERED = 1, STREAMING = 2 };

struct loip_http_req {
    loip_http *srv;
    struct MHD_Connection *conn;
    char method[16];
    char url[1024];
    char *body;
    uint64_t len, cap;
    int too_large;        /* the body passed max_body: what was read is dropped */
    int queued;           /* handed to the caller */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state;            /* WAITING, ANSWERED, STREAMING */
    int status;
    char content_type[64];
    char *headers;        /* "Name: value\n" lines, owned */
    char *out;            /* the whole answer, or the stream's pending bytes */
    uint64_t out_len, out_cap, out_at;
    int stream_done;      /* the caller wrote the stream's end */
    int cancelled;        /* the client hung up (or the server stops) */
    int refs;             /* the connection's thread and the caller */
    loip_http_req *next;  /* in the queue */
};

struct loip_http {
    struct MHD_Daemon *d;
    uint64_t max_body;
    int port;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    loip_http_req *head, *tail;
    int stopping;
    int inflight;        /* requests begun and not completed (under mu) */
};

static void req_release(loip_http_req *r) {
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left > 0) return;
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->body);
    free(r->headers);
    free(r->out);
    free(r);
}

/* The client hung up: a read of 0 bytes or an error on its socket (data it sent early, a
 * pipelined request, is left where it is). */
static int peer_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP)) return 1;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0;
}

/* Wait on r's condition for up to ms (under r->mu). */
static void wait_ms(loip_http_req *r, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&r->cv, &r->mu, &ts);
}

static void add_headers(struct MHD_Response *resp, const char *content_type, const char *lines) {
    if (content_type && *content_type) MHD_add_response_header(resp, "Content-Type", content_type);
    if (!lines) return;
    char *copy = strdup(lines), *save = NULL;
    if (!copy) return;
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        *colon = 0;
        const char *v = colon + 1;
        while (*v == ' ') v++;
        MHD_add_response_header(resp, line, v);
    }
    free(copy);
}

/* The stream's bytes as the caller writes them; blocks (this connection's thread only) until
 * there are some, the end, or the client leaves. */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    loip_http_req *r = cls;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        if (r->out_at < r->out_len) {
            size_t n = r->out_len - r->out_at < max ? (size_t)(r->out_len - r->out_at) : max;
            memcpy(buf, r->out + r->out_at, n);
            r->out_at += n;
            if (r->out_at == r->out_len) r->out_at = r->out_len = 0;
            pthread_mutex_unlock(&r->mu);
            return (ssize_t)n;
        }
        if (r->stream_done) {
            pthread_mutex_unlock(&r->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (r->cancelled || r->srv->stopping) {
            r->cancelled = 1;
            pthread_mutex_unlock(&r->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        pthread_mutex_unlock(&r->mu);
        int gone = peer_gone(r->conn);
        pthread_mutex_lock(&r->mu);
        if (gone) r->cancelled = 1;
        else wait_ms(r, 100);
    }
}

static void stream_free(void *cls) { req_release(cls); }

static enum MHD_Result send_text(struct MHD_Connection *c, int status, const char *type, const char *text) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    add_headers(resp, type, NULL);
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return rc;
}

static const char STOPPING[] =
    "{\"error\":{\"message\":\"the server is stopping\",\"type\":\"server_error\",\"code\":\"stopping\"}}";

/* The headers are in: a request object, the body to come (NULL: out of memory). */
static loip_http_req *req_new(loip_http *srv, struct MHD_Connection *c, const char *url, const char *method) {
    loip_http_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->srv = srv, r->conn = c, r->refs = 1;
    snprintf(r->method, sizeof r->method, "%s", method);
    snprintf(r->url, sizeof r->url, "%s", url);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > srv->max_body) r->too_large = 1;
    pthread_mutex_lock(&srv->mu);
    srv->inflight++;
    pthread_mutex_unlock(&srv->mu);
    return r;
}

/* A piece of the body, appended (NUL-terminated); past max_body the body is dropped and the
 * request marked too large. 0: out of memory. */
static int req_append(loip_http_req *r, const char *upload, size_t n) {
    if (r->too_large) return 1;
    if (r->len + n > r->srv->max_body) {
        r->too_large = 1;
        free(r->body);
        r->body = NULL, r->len = r->cap = 0;
        return 1;
    }
    if (r->len + n + 1 > r->cap) {
        uint64_t cap = r->cap ? r->cap : 4096;
        while (cap < r->len + n + 1) cap *= 2;
        char *b = realloc(r->body, cap);
        if (!b) return 0;
        r->body = b, r->cap = cap;
    }
    memcpy(r->body + r->len, upload, n);
    r->len += n;
    r->body[r->len] = 0;
    return 1;
}

/* The whole request, queued for the caller (loip_http_next). */
static void req_queue(loip_http *srv, loip_http_req *r) {
    pthread_mutex_lock(&r->mu);
    r->refs++, r->queued = 1;
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&srv->mu);
    if (srv->tail) srv->tail->next = r;
    else srv->head = r;
    srv->tail = r;
    pthread_cond_signal(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
}

/* Waits (r->mu held) until the caller answers or starts a stream, the client leaving meanwhile
 * marking it cancelled; 0 when the server stops first. */
static int req_wait_answer(loip_http *srv, loip_http_req *r, struct MHD_Connection *c) {
    while (r->state == WAITING && !srv->stopping) {
        pthread_mutex_unlock(&r->mu);
        int gone = !r->cancelled && peer_gone(c);
        pthread_mutex_lock(&r->mu);
        if (gone) r->cancelled = 1;
        if (r->state == WAITING) wait_ms(r, 100);
    }
    return r->state != WAITING;
}

/* The answer (r->mu held): whole, or a stream its reader takes bytes from. */
static struct MHD_Response *req_response(loip_http_req *r) {
    if (r->state == ANSWERED)
        return MHD_create_response_from_buffer((size_t)r->out_len, r->out ? r->out : (void *)"",
                                               MHD_RESPMEM_MUST_COPY);
    r->refs++; /* the stream's reader holds the request until MHD frees the response */
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, r,
                                                                  stream_free);
    if (!resp) r->refs--;
    return resp;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    loip_http *srv = cls;
    loip_http_req *r = *con_cls;
    if (!r) {
        if (!(r = req_new(srv, c, url, method))) return MHD_NO;
        *con_cls = r;
        return MHD_YES;
    }
    if (*upload_size > 0) {
        if (!req_append(r, upload, *upload_size)) return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    if (r->state == WAITING && !r->queued) { /* the whole request: to the caller, then wait */
        if (srv->stopping) return send_text(c, 503, "application/json", STOPPING);
        req_queue(srv, r);
    }
    pthread_mutex_lock(&r->mu);
    if (!req_wait_answer(srv, r, c)) { /* stopping with no answer */
        r->cancelled = 1;
        pthread_mutex_unlock(&r->mu);
        return send_text(c, 503, "application/json", STOPPING);
    }
    struct MHD_Response *resp = req_response(r);
    int status = r->status;
    if (resp) add_headers(resp, r->content_type, r->headers);
    pthread_mutex_unlock(&r->mu);
    if (!resp) return MHD_NO;
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return rc;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)c;
    loip_http *srv = cls;
    loip_http_req *r = *con_cls;
    if (!r) return;
    pthread_mutex_lock(&srv->mu);
    srv->inflight--;
    pthread_cond_broadcast(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
    pthread_mutex_lock(&r->mu);
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) r->cancelled = 1;
    r->conn = NULL;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    *con_cls = NULL;
    req_release(r);
}

LOIP_API int loip_http_start(const char *host, int32_t port, uint64_t max_body, int32_t max_connections,
                             int32_t timeout_s, loip_http **out) {
    *out = NULL;
    if (port < 0 || port > 65535) return loip_fail(LOIP_EINVAL, "http: port %d is not in 0..65535", port);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host && *host ? host : "127.0.0.1", &addr.sin_addr) != 1)
        return loip_fail(LOIP_EINVAL, "http: host '%s' is not an IPv4 address", host);
    loip_http *s = calloc(1, sizeof *s);
    if (!s) return loip_fail(LOIP_ENOMEM, "http: out of memory");
    s->max_body = max_body;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL,
                            0, NULL, NULL, on_request, s,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(max_connections > 0 ? max_connections : 256),
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(timeout_s > 0 ? timeout_s : 30),
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_END);
    if (!s->d) {
        int e = errno;
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s);
        return loip_fail(LOIP_EIO, "http: cannot listen at %s:%d: %s", host && *host ? host : "127.0.0.1", port,
                         e ? strerror(e) : "the address is in use or not this machine's");
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : port;
    *out = s;
    return LOIP_OK;
}

LOIP_API int32_t loip_http_port(const loip_http *s) { return s->port; }

LOIP_API void loip_http_stop(loip_http *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    /* requests the caller never took: answered 503 by their threads, released here */
    loip_http_req *r = s->head;
    s->head = s->tail = NULL;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    while (r) {
        loip_http_req *next = r->next;
        pthread_mutex_lock(&r->mu);
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        req_release(r);
        r = next;
    }
    /* answers already given are written out first (up to 2 s): stopping the daemon closes every
     * connection at once, mid-answer or not */
    pthread_mutex_lock(&s->mu);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 2;
    while (s->inflight > 0 && pthread_cond_timedwait(&s->cv, &s->mu, &ts) != ETIMEDOUT) {}
    pthread_mutex_unlock(&s->mu);
    MHD_stop_daemon(s->d); /* (waits for the connections' threads: their waits end on stopping) */
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

LOIP_API int loip_http_next(loip_http *s, int32_t timeout_ms, loip_http_req **out) {
    *out = NULL;
    pthread_mutex_lock(&s->mu);
    if (!s->head && timeout_ms > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += timeout_ms / 1000;
        ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        while (!s->head && !s->stopping && pthread_cond_timedwait(&s->cv, &s->mu, &ts) != ETIMEDOUT) {}
    }
    loip_http_req *r = s->head;
    if (r) {
        s->head = r->next;
        if (!s->head) s->tail = NULL;
        r->next = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    *out = r;
    return r ? 1 : 0;
}

LOIP_API const char *loip_http_method(const loip_http_req *r) { return r->method; }
LOIP_API const char *loip_http_url(const loip_http_req *r) { return r->url; }
LOIP_API const char *loip_http_body(const loip_http_req *r, uint64_t *len, int32_t *too_large) {
    *len = r->len;
    *too_large = r->too_large;
    return r->body ? r->body : "";
}

/* A request header's value into buf (cap bytes); 0 when absent. (The connection's headers
 * are read under the request's lock: the connection ends only after the answer.) */
LOIP_API int loip_http_header(loip_http_req *r, const char *name, char *buf, size_t cap) {
    pthread_mutex_lock(&r->mu);
    const char *v = r->conn ? MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name) : NULL;
    if (v) snprintf(buf, cap, "%s", v);
    pthread_mutex_unlock(&r->mu);
    return v ? 1 : 0;
}

LOIP_API int loip_http_cancelled(loip_http_req *r) {
    pthread_mutex_lock(&r->mu);
    int c = r->cancelled;
    pthread_mutex_unlock(&r->mu);
    return c;
}

static int set_head(loip_http_req *r, int32_t status, const char *content_type, const char *headers) {
    if (status < 100 || status > 599) return loip_fail(LOIP_EINVAL, "http: status %d", status);
    r->status = status;
    snprintf(r->content_type, sizeof r->content_type, "%s", content_type ? content_type : "");
    free(r->headers);
    r->headers = headers && *headers ? strdup(headers) : NULL;
    return LOIP_OK;
}

static int append(loip_http_req *r, const void *data, uint64_t len) {
    if (r->out_len + len > r->out_cap) {
        uint64_t cap = r->out_cap ? r->out_cap : 4096;
        while (cap < r->out_len + len) cap *= 2;
        char *o = realloc(r->out, cap);
        if (!o) return loip_fail(LOIP_ENOMEM, "http: out of memory");
        r->out = o, r->out_cap = cap;
    }
    if (len) memcpy(r->out + r->out_len, data, len);
    r->out_len += len;
    return LOIP_OK;
}

LOIP_API int loip_http_respond(loip_http_req *r, int32_t status, const char *content_type, const char *headers,
                               const void *body, uint64_t len) {
    pthread_mutex_lock(&r->mu);
    int rc = r->state != WAITING ? loip_fail(LOIP_ESTATE, "http: %s %s was answered already", r->method, r->url)
                                 : set_head(r, status, content_type, headers);
    if (rc == LOIP_OK) {
        r->out_len = r->out_at = 0;
        if ((rc = append(r, body, len)) == LOIP_OK) r->state = ANSWERED;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

LOIP_API int loip_http_stream_begin(loip_http_req *r, int32_t status, const char *content_type, const char *headers) {
    pthread_mutex_lock(&r->mu);
    int rc = r->state != WAITING ? loip_fail(LOIP_ESTATE, "http: %s %s was answered already", r->method, r->url)
                                 : set_head(r, status, content_type, headers);
    if (rc == LOIP_OK) r->state = STREAMING;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

LOIP_API int loip_http_stream_write(loip_http_req *r, const void *data, uint64_t len, int32_t end) {
    pthread_mutex_lock(&r->mu);
    int rc = LOIP_OK;
    if (r->state != STREAMING) rc = loip_fail(LOIP_ESTATE, "http: %s %s is not a stream", r->method, r->url);
    else if (r->cancelled) rc = loip_fail(LOIP_EIO, "http: the client of %s %s hung up", r->method, r->url);
    else if (r->stream_done) rc = loip_fail(LOIP_ESTATE, "http: the stream of %s %s has ended", r->method, r->url);
    else if ((rc = append(r, data, len)) == LOIP_OK && end) r->stream_done = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

LOIP_API uint64_t loip_http_stream_pending(loip_http_req *r) {
    pthread_mutex_lock(&r->mu);
    uint64_t n = r->out_len - r->out_at;
    pthread_mutex_unlock(&r->mu);
    return n;
}

LOIP_API void loip_http_release(loip_http_req *r) {
    if (r) req_release(r);
}
