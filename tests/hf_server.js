// A tiny Hugging Face-compatible model server for the `loip pull` specs (plain node, no npm
// packages). It serves one repository from a directory, as the Hub does:
//   GET /api/models/OWNER/NAME/tree/REV[/PATH]?recursive=true[&cursor=K]
//       a JSON array of {type, path, size, oid[, lfs: {oid (sha256), size, pointerSize}]},
//       paginated by `Link: <next>; rel="next"` with --page-size
//   GET /OWNER/NAME/resolve/REV/PATH   302 to /cdn/OWNER/NAME/REV/PATH (as the Hub redirects
//       to its CDN; on --cdn-host HOST, to http://HOST:PORT/cdn/...)
//   GET /cdn/...                       the bytes, with Range (206, Content-Range; 416)
// Errors carry the Hub's X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound).
//
// usage: node tests/hf_server.js --root DIR [--repo OWNER/NAME] [--revision REV]
//          [--lfs GLOB]... [--page-size N] [--token T] [--cut PATH:N]... [--corrupt PATH]
//          [--list-size PATH:N]... [--no-range] [--cdn-host HOST] [--log FILE]
//   --lfs GLOB      files listed as stored with Git LFS (their sha256 in lfs.oid); default *.safetensors
//   --token T       tree and resolve need "Authorization: Bearer T": 401 without, 403 with another
//   --refuse 401    answer another token with 401 (the Hub's answer to an invalid token), not 403
//   --cut PATH:N    the first download of PATH that reaches byte N sends bytes up to N and then
//                   drops the connection (once)
//   --stall PATH:N  as --cut, but the connection stays open and silent after byte N (once)
//   --corrupt PATH  PATH is served with one byte changed (its listing stays right)
//   --list-size PATH:N  the listing gives PATH's size as N (its bytes are served as they are)
//   --no-range      Range is ignored: always 200 and the whole file
//   --log FILE      a JSON line per request: kind, path, host, range, auth (none|ok|wrong), status
//                   (never the token itself)
// It listens on 127.0.0.1, port 0, and prints the port as its first line on stdout. It exits
// when its stdin closes or its parent goes.
'use strict';
const http = require('http');
const fs = require('fs');
const path = require('path');
const crypto = require('crypto');

function parseArgs(argv) {
  const o = { repo: 'test/model', revision: 'main', lfs: [], cut: {}, stall: {}, listSize: {}, pageSize: 0, range: true, refuse: 403 };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const val = () => {
      if (i + 1 >= argv.length) throw new Error(a + ' needs a value');
      return argv[++i];
    };
    if (a === '--root') o.root = val();
    else if (a === '--repo') o.repo = val();
    else if (a === '--revision') o.revision = val();
    else if (a === '--lfs') o.lfs.push(val());
    else if (a === '--page-size') o.pageSize = parseInt(val(), 10);
    else if (a === '--token') o.token = val();
    else if (a === '--refuse') o.refuse = parseInt(val(), 10);
    else if (a === '--cut') {
      const m = /^(.*):(\d+)$/.exec(val());
      if (!m) throw new Error('--cut PATH:N');
      o.cut[m[1]] = parseInt(m[2], 10);
    } else if (a === '--stall') {
      const m = /^(.*):(\d+)$/.exec(val());
      if (!m) throw new Error('--stall PATH:N');
      o.stall[m[1]] = parseInt(m[2], 10);
    } else if (a === '--list-size') {
      const m = /^(.*):(\d+)$/.exec(val());
      if (!m) throw new Error('--list-size PATH:N');
      o.listSize[m[1]] = parseInt(m[2], 10);
    } else if (a === '--corrupt') o.corrupt = val();
    else if (a === '--no-range') o.range = false;
    else if (a === '--cdn-host') o.cdnHost = val();
    else if (a === '--log') o.log = val();
    else throw new Error('unknown argument ' + a);
  }
  if (!o.root) throw new Error('--root DIR is required');
  if (o.lfs.length === 0) o.lfs.push('*.safetensors');
  return o;
}

// fnmatch as huggingface_hub uses it: * and ? match any character, / included
function globRegExp(g) {
  const body = g.replace(/[.+^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '.*').replace(/\?/g, '.');
  return new RegExp('^' + body + '$');
}

const opts = parseArgs(process.argv.slice(2));
const lfsRes = opts.lfs.map(globRegExp);
const sha = (algo, ...parts) => {
  const h = crypto.createHash(algo);
  for (const p of parts) h.update(p);
  return h.digest('hex');
};

// The repository: every file under root, read once (the specs' models are small).
const files = new Map(); // path -> {bytes, entry}
const dirs = [];
function walk(rel) {
  for (const name of fs.readdirSync(path.join(opts.root, rel)).sort()) {
    const p = rel ? rel + '/' + name : name;
    const st = fs.statSync(path.join(opts.root, p));
    if (st.isDirectory()) {
      dirs.push(p);
      walk(p);
    } else if (st.isFile()) {
      const bytes = fs.readFileSync(path.join(opts.root, p));
      const entry = { type: 'file', path: p, size: bytes.length };
      if (lfsRes.some((re) => re.test(p))) {
        const oid = sha('sha256', bytes);
        const pointer = `version https://git-lfs.github.com/spec/v1\noid sha256:${oid}\nsize ${bytes.length}\n`;
        entry.oid = sha('sha1', `blob ${pointer.length}\0`, pointer);
        entry.lfs = { oid, size: bytes.length, pointerSize: pointer.length };
      } else {
        entry.oid = sha('sha1', `blob ${bytes.length}\0`, bytes);
      }
      if (opts.listSize[p] !== undefined) {
        entry.size = opts.listSize[p];
        if (entry.lfs) entry.lfs.size = opts.listSize[p];
      }
      let served = bytes;
      if (p === opts.corrupt) {
        served = Buffer.from(bytes);
        served[served.length >> 1] ^= 0xff;
      }
      files.set(p, { served, entry });
    }
  }
}
walk('');
if (opts.corrupt && !files.has(opts.corrupt)) throw new Error('--corrupt: no file ' + opts.corrupt);
const entries = [...dirs.map((p) => ({ type: 'directory', path: p, size: 0, oid: sha('sha1', 'tree ' + p) })),
  ...[...files.values()].map((f) => f.entry)].sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));

function log(rec) {
  if (opts.log) fs.appendFileSync(opts.log, JSON.stringify(rec) + '\n');
}

function authState(req) {
  const h = req.headers.authorization;
  if (!h) return 'none';
  return opts.token !== undefined && h === 'Bearer ' + opts.token ? 'ok' : 'wrong';
}

function send(res, status, headers, body) {
  res.writeHead(status, Object.assign({ 'Content-Length': Buffer.byteLength(body || '') }, headers));
  res.end(body || '');
}

function fail(res, status, code, message) {
  const headers = { 'Content-Type': 'application/json' };
  if (code) headers['X-Error-Code'] = code;
  if (message) headers['X-Error-Message'] = message;
  send(res, status, headers, JSON.stringify({ error: message }));
}

// The checks of the API and resolve: token, repository, revision. Returns the status sent, or 0.
function gate(req, res, repo, rev, auth) {
  if (opts.token !== undefined && auth === 'none') {
    fail(res, 401, null, 'Access to this model is restricted: you must be authenticated');
    return 401;
  }
  if (opts.token !== undefined && auth === 'wrong') {
    if (opts.refuse === 401) fail(res, 401, null, 'Invalid credentials in Authorization header');
    else fail(res, 403, 'GatedRepo', 'Access to this model is restricted: this token has no access to it');
    return opts.refuse === 401 ? 401 : 403;
  }
  if (repo !== opts.repo) {
    fail(res, 404, 'RepoNotFound', 'Repository not found');
    return 404;
  }
  if (rev !== opts.revision) {
    fail(res, 404, 'RevisionNotFound', 'Invalid rev id: ' + rev);
    return 404;
  }
  return 0;
}

function tree(req, res, url, m, rec) {
  const repo = decodeURIComponent(m[1]) + '/' + decodeURIComponent(m[2]);
  const rev = decodeURIComponent(m[3]);
  const under = m[4] ? m[4].split('/').map(decodeURIComponent).join('/') : '';
  rec.status = gate(req, res, repo, rev, rec.auth);
  if (rec.status) return log(rec);
  const recursive = url.searchParams.get('recursive') === 'true';
  let list = entries.filter((e) => {
    if (under && !e.path.startsWith(under + '/')) return false;
    const rest = under ? e.path.slice(under.length + 1) : e.path;
    return recursive || !rest.includes('/');
  });
  const headers = { 'Content-Type': 'application/json' };
  if (opts.pageSize > 0) {
    const from = parseInt(url.searchParams.get('cursor') || '0', 10);
    if (from + opts.pageSize < list.length) {
      const next = new URL(url.href);
      next.searchParams.set('cursor', String(from + opts.pageSize));
      headers.Link = `<${next.href}>; rel="next"`;
    }
    list = list.slice(from, from + opts.pageSize);
  }
  rec.status = 200;
  log(rec);
  send(res, 200, headers, JSON.stringify(list));
}

function resolve(req, res, url, m, rec) {
  const repo = decodeURIComponent(m[1]) + '/' + decodeURIComponent(m[2]);
  const rev = decodeURIComponent(m[3]);
  const p = m[4].split('/').map(decodeURIComponent).join('/');
  rec.path = p;
  rec.status = gate(req, res, repo, rev, rec.auth);
  if (rec.status) return log(rec);
  if (!files.has(p)) {
    rec.status = 404;
    log(rec);
    return fail(res, 404, 'EntryNotFound', 'Entry not found');
  }
  const where = '/cdn/' + m[1] + '/' + m[2] + '/' + m[3] + '/' + m[4];
  const location = opts.cdnHost ? `http://${opts.cdnHost}:${server.address().port}${where}` : where;
  rec.status = 302;
  log(rec);
  send(res, 302, { Location: location, 'X-Repo-Commit': '0123456789abcdef0123456789abcdef01234567' }, '');
}

function cdn(req, res, m, rec) {
  const p = m[4].split('/').map(decodeURIComponent).join('/');
  rec.path = p;
  const f = files.get(p);
  if (!f) {
    rec.status = 404;
    log(rec);
    return fail(res, 404, null, 'Not found');
  }
  const size = f.served.length;
  let start = 0;
  let end = size - 1;
  let status = 200;
  const range = opts.range && req.headers.range;
  if (range) {
    const r = /^bytes=(\d+)-(\d*)$/.exec(range);
    if (!r) {
      rec.status = 400;
      log(rec);
      return fail(res, 400, null, 'bad Range');
    }
    start = parseInt(r[1], 10);
    if (r[2]) end = Math.min(parseInt(r[2], 10), size - 1);
    if (start >= size || start > end) {
      rec.status = 416;
      log(rec);
      return send(res, 416, { 'Content-Range': `bytes */${size}` }, '');
    }
    status = 206;
  }
  const headers = { 'Content-Length': end - start + 1, 'Accept-Ranges': 'bytes', 'Content-Type': 'application/octet-stream' };
  if (status === 206) headers['Content-Range'] = `bytes ${start}-${end}/${size}`;
  rec.status = status;
  const cutAt = opts.cut[p];
  if (cutAt !== undefined && start < cutAt && cutAt <= end) {
    delete opts.cut[p];
    rec.cut = cutAt;
    log(rec);
    res.writeHead(status, headers);
    // the bytes up to the cut reach the client, then the connection drops mid-body
    res.write(f.served.subarray(start, cutAt), () => setTimeout(() => req.socket.destroy(), 20));
    return;
  }
  const stallAt = opts.stall[p];
  if (stallAt !== undefined && start < stallAt && stallAt <= end) {
    delete opts.stall[p];
    rec.stall = stallAt;
    log(rec);
    res.writeHead(status, headers);
    res.write(f.served.subarray(start, stallAt)); // and nothing more: the client must give up
    return;
  }
  log(rec);
  res.writeHead(status, headers);
  res.end(f.served.subarray(start, end + 1));
}

const server = http.createServer((req, res) => {
  const url = new URL(req.url, `http://${req.headers.host}`);
  const rec = { method: req.method, url: url.pathname, query: url.search, host: req.headers.host, range: req.headers.range || null,
    auth: authState(req) };
  let m;
  if (req.method !== 'GET') {
    rec.status = 405;
    log(rec);
    return fail(res, 405, null, 'GET only');
  }
  if ((m = /^\/api\/models\/([^/]+)\/([^/]+)\/tree\/([^/]+)(?:\/(.+))?$/.exec(url.pathname))) {
    rec.kind = 'tree';
    return tree(req, res, url, m, rec);
  }
  if ((m = /^\/([^/]+)\/([^/]+)\/resolve\/([^/]+)\/(.+)$/.exec(url.pathname))) {
    rec.kind = 'resolve';
    return resolve(req, res, url, m, rec);
  }
  if ((m = /^\/cdn\/([^/]+)\/([^/]+)\/([^/]+)\/(.+)$/.exec(url.pathname))) {
    rec.kind = 'cdn';
    return cdn(req, res, m, rec);
  }
  rec.status = 404;
  log(rec);
  fail(res, 404, null, 'Not found');
});

server.listen(0, '127.0.0.1', () => {
  process.stdout.write(server.address().port + '\n');
});

// Die with the parent: stdin closing (the spec holds its other end), or a new parent.
process.stdin.on('end', () => process.exit(0));
process.stdin.on('error', () => process.exit(0));
process.stdin.resume();
const parent = process.ppid;
setInterval(() => {
  if (process.ppid !== parent) process.exit(0);
}, 250).unref();
