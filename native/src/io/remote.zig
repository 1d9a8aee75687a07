//! Caches on object storage: the transport is a small table of C callbacks (`Ops`: open an
//! object and learn its size, read a byte range into a caller buffer, close) that the
//! embedder supplies: the Python layer passes its object-store client through it, a C,
//! C++ or Rust program its own. Everything that decides correctness is here:
//!
//! - `fetchCache` downloads `manifest.json`, `index.bin` and `metadata.arrow` of a cache URL
//!   into `<root>/caches/<sha256 of the manifest>/`, verifying the two files against the
//!   manifest's SHA-256 (as `validate_cache` does locally) before the directory appears
//!   (temporary directory + rename). The store layer then opens that directory as a
//!   local cache whose shards come from here.
//! - `openShard` returns a descriptor of the shard's verified copy in the shard cache
//!   (`shardcache.zig`), downloading it first when it is absent: the size the server
//!   reports and the SHA-256 of the bytes must match the manifest, or nothing is kept.
//!   The I/O backends (io_uring, threads) then read the local file as any other.
//! - Or byte ranges (`Origin.readRange`): the read policy (`Origin.readsRanges`) sends
//!   lookups of a shard that is not in the shard cache, and shuffled iterators over a
//!   cache larger than the budget, to ranged reads of the shard's object straight into
//!   the reader's memory. No SHA-256 can check a range: the object's size is checked
//!   when it is opened, the handle pins the version seen then (the transport makes every
//!   read conditional on its ETag: `Code.changed` once it was replaced) and stays open
//!   until the cache closes, and the reader checks each record's framing. Iterators'
//!   ranges are fetched ahead in plan order (`Origin.aheadRange`).
//! - Transient failures (`Code.retry`: connection refused or reset, timeouts, 5xx, a short
//!   body) are retried with exponential backoff; a reset mid-file continues from the
//!   chunk that failed. Then the error names the URL. A 404 and a 403 have their own
//!   messages.
//!
//! Memory: no download buffer: each range is written by the transport straight into a
//! shared mapping of the shard's preallocated temporary file (see `download`).
//! Thread safety: the callbacks may be called from any thread, concurrently.

const std = @import("std");
const mem_mod = @import("../base/mem.zig");
const posix = std.posix;
const status = @import("../base/status.zig");
const Sha256 = @import("../codec/sha256.zig").Sha256;
const index = @import("../format/index.zig");
const manifest = @import("../format/manifest.zig");
const shardcache = @import("shardcache.zig");
const ShardCache = shardcache.ShardCache;
const cache = @import("../store/cache.zig");
const runtime = @import("../base/runtime.zig");

/// What a callback reports (`DRT_REMOTE_*`).
pub const Code = enum(i32) {
    ok = 0,
    /// No object at that URL (HTTP 404).
    not_found = 1,
    /// Credentials missing or refused (HTTP 401/403).
    denied = 2,
    /// Transient: worth retrying (connection refused or reset, timeout, 5xx, short body).
    retry = 3,
    /// Anything else; not retried.
    failed = 4,
    /// (ABI 1.8) The object is no longer the version its handle opened (HTTP 412 on a
    /// read made conditional on the ETag seen at open): never retried, never mixed.
    changed = 5,
};

/// The callback table (`drt_remote_ops`). `message` is a buffer of `message_cap` bytes for
/// a NUL-terminated explanation when a callback does not return `ok`.
pub const Ops = extern struct {
    context: ?*anyopaque,
    /// Opens the object at `url`: its size, and a handle that pins the version seen now
    /// (its ETag or version id) when the store has one.
    open: ?*const fn (context: ?*anyopaque, url: [*:0]const u8, size: *u64, handle: *?*anyopaque, message: [*]u8, message_cap: u64) callconv(.c) i32,
    /// Reads exactly `len` bytes at `offset` into `buf`, of the version `open` pinned
    /// (`Code.changed` when the object was replaced since).
    read: ?*const fn (context: ?*anyopaque, handle: ?*anyopaque, offset: u64, buf: [*]u8, len: u64, message: [*]u8, message_cap: u64) callconv(.c) i32,
    close: ?*const fn (context: ?*anyopaque, handle: ?*anyopaque) callconv(.c) void,
};

/// The optional file writer of a transport (`drt_remote_read_file_fn`, set with
/// `Remote.setReadFile`): writes exactly `len` bytes at `offset` of the object into the
/// file `fd` at the same offset (positional writes, many threads on one file), of the
/// version `open` pinned.
pub const ReadFileFn = *const fn (context: ?*anyopaque, handle: ?*anyopaque, offset: u64, len: u64, fd: i32, message: [*]u8, message_cap: u64) callconv(.c) i32;

/// The optional release function of a transport (`drt_remote_release_fn`, set with
/// `Remote.setRelease`): called once with `Ops.context` when the last reference to the
/// remote is dropped (its datasets closed, its fetches ahead ended), after which no
/// callback of the transport is made.
pub const ReleaseFn = *const fn (context: ?*anyopaque) callconv(.c) void;

pub const Options = struct {
    /// The local directory: `caches/` (metadata copies) and `shards/` (the shard cache).
    root: []const u8,
    /// Bytes of shard files kept in `<root>/shards`.
    budget: u64,
    /// Further attempts after a transient failure.
    retries: u32 = 5,
    /// First backoff; doubled after each attempt, at most 2 s.
    backoff_ns: u64 = 100 * std.time.ns_per_ms,
    /// Largest byte range of a reader's own fetch (and of index.bin / metadata.arrow).
    chunk_bytes: usize = 16 << 20,
    /// Byte ranges of one shard fetched at once by a reader's own fetch (the calling
    /// thread and pool workers): a 64 MiB shard is 4 GETs of 16 MiB.
    parallel_parts: u32 = 4,
};

/// Byte ranges one background fetch (look-ahead) takes at once, and their size: a shard
/// of up to 64 MiB is one GET, so a fetch ahead costs one request, and `Origin.slots_max`
/// shards are in flight at once. A range costs no memory of ours (it is written straight
/// into the shard file, see `download`), so it can be as large as a shard;
/// fewer, larger requests cost less per byte on the server and per epoch in requests.
const background_parts = 2;
const background_range_bytes = 64 << 20;

/// Largest manifest.json accepted (as locally).
const manifest_bytes_max = 64 << 20;

/// An open object store transport with its local directory. Reference counted: every
/// dataset opened through it holds a reference.
pub const Remote = struct {
    gpa: std.mem.Allocator,
    refs: std.atomic.Value(u32) = .init(1),
    ops: Ops,
    /// Shard, index and metadata downloads are written with it when set (see `download`).
    read_file: std.atomic.Value(?ReadFileFn) = .init(null),
    /// Called by the last `release` (see `ReleaseFn`).
    on_release: std.atomic.Value(?ReleaseFn) = .init(null),
    root: []u8,
    shards_path: []u8,
    shards: ShardCache,
    options: Options,
    /// Bytes of shard downloads in flight in this process (see `reserve`).
    mutex: std.Thread.Mutex = .{},
    cond: std.Thread.Condition = .{},
    in_flight: u64 = 0,
    /// The process that opened it: a forked child gets error.Forked (the parent's
    /// downloads in flight never finish there, see `checkPid`).
    pid: std.posix.pid_t,

    pub fn create(gpa: std.mem.Allocator, ops: Ops, options: Options) status.Error!*Remote {
        if (ops.open == null or ops.read == null or ops.close == null) return status.fail(error.InvalidArgument, "remote ops: open, read and close are required", .{});
        if (options.root.len == 0) return status.fail(error.InvalidArgument, "remote: the local cache directory must not be empty", .{});
        if (std.mem.indexOfScalar(u8, options.root, 0) != null) return status.fail(error.InvalidArgument, "remote: the local cache directory contains a NUL byte", .{});
        const root = try gpa.dupe(u8, std.mem.trimRight(u8, options.root, "/"));
        errdefer gpa.free(root);
        const shards_path = try std.fmt.allocPrint(gpa, "{s}/shards", .{root});
        errdefer gpa.free(shards_path);
        var shards = try ShardCache.open(shards_path, options.budget);
        errdefer shards.close();
        const r = try gpa.create(Remote);
        r.* = .{ .gpa = gpa, .ops = ops, .root = root, .shards_path = shards_path, .shards = shards, .options = options, .pid = runtime.currentPid() };
        r.options.root = root;
        sweepCacheTemps(root);
        return r;
    }

    /// Downloads write through `f` from now on (null: into a mapping with `ops.read`).
    pub fn setReadFile(r: *Remote, f: ?ReadFileFn) void {
        r.read_file.store(f, .release);
    }

    /// `f` is called with the transport's context once the last reference is dropped
    /// (null: nothing is called).
    pub fn setRelease(r: *Remote, f: ?ReleaseFn) void {
        r.on_release.store(f, .release);
    }

    /// error.Forked in a process other than the one that opened the remote: the parent's
    /// fetches (threads, bytes in flight) do not exist there, so waiting on them would hang.
    pub fn checkPid(r: *const Remote) status.Error!void {
        if (r.pid != runtime.currentPid()) return runtime.forkedError();
    }

    pub fn retain(r: *Remote) *Remote {
        _ = r.refs.fetchAdd(1, .monotonic);
        return r;
    }

    /// In a forked child a no-op (as `Runtime.release`): the parent's state is not the
    /// child's to free. Every holder of a reference that calls the transport (a dataset's
    /// caches, a fetch ahead through its `Origin`) holds one until its last call returned,
    /// so the last release is past every callback; it calls `on_release` after freeing.
    pub fn release(r: *Remote) void {
        if (r.refs.fetchSub(1, .acq_rel) != 1) return;
        if (r.pid != runtime.currentPid()) return;
        const on_release = r.on_release.load(.acquire);
        const context = r.ops.context;
        r.shards.close();
        r.gpa.free(r.shards_path);
        r.gpa.free(r.root);
        r.gpa.destroy(r);
        if (on_release) |f| f(context);
    }

    // ------------------------------------------------------------ objects

    const Object = struct { handle: ?*anyopaque, size: u64 };

    /// Opens `url`, retrying transient failures. A missing object is an I/O error ("no
    /// object at <url>: ..."), as a file missing from a local cache is.
    fn openObject(r: *Remote, url: [:0]const u8) status.Error!Object {
        return try r.openObjectIfAny(url) orelse error.Io;
    }

    /// `openObject`, or null when the store has no object at `url`.
    fn openObjectIfAny(r: *Remote, url: [:0]const u8) status.Error!?Object {
        var obj: Object = .{ .handle = null, .size = 0 };
        if (!try r.retriedUnlessMissing(url, r.ops.open.?, .{ r.ops.context, url.ptr, &obj.size, &obj.handle })) return null;
        return obj;
    }

    /// Reads `buf.len` bytes at `offset` of an open object, retrying transient failures.
    fn readObject(r: *Remote, obj: Object, url: [:0]const u8, offset: u64, buf: []u8) status.Error!void {
        try r.retried(url, r.ops.read.?, .{ r.ops.context, obj.handle, offset, buf.ptr, @as(u64, buf.len) });
    }

    /// Writes the `len` bytes at `offset` of an open object into `fd` at `offset` with
    /// `read_file`, retrying transient failures.
    fn readObjectToFile(r: *Remote, read_file: ReadFileFn, obj: Object, url: [:0]const u8, offset: u64, len: u64, fd: posix.fd_t) status.Error!void {
        try r.retried(url, read_file, .{ r.ops.context, obj.handle, offset, len, fd });
    }

    /// Calls the transport function `call` with `args` and then a fresh message buffer
    /// and its capacity (every transport function ends so), until it succeeds; transient
    /// failures are retried with backoff, others fail (see `retryOrFail`).
    fn retried(r: *Remote, url: [:0]const u8, call: anytype, args: anytype) status.Error!void {
        if (!try r.retriedUnlessMissing(url, call, args)) return error.Io;
    }

    /// `retried`, but false when the store says there is no object at `url` (with this
    /// thread's message set to "no object at <url>: ...", the I/O error a file missing
    /// from a local cache is).
    fn retriedUnlessMissing(r: *Remote, url: [:0]const u8, call: anytype, args: anytype) status.Error!bool {
        var attempt: u32 = 0;
        while (true) : (attempt += 1) {
            var message: [512]u8 = @splat(0);
            const rc = @call(.auto, call, args ++ .{ @as([*]u8, &message), @as(u64, message.len) });
            switch (try r.retryOrFail(rc, url, &message, attempt)) {
                .done => return true,
                .missing => {
                    const missing = status.fail(error.Io, "no object at {s}: {s}", .{ url, std.mem.sliceTo(&message, 0) });
                    std.debug.assert(missing == error.Io); // the message is what counts here
                    return false;
                },
                .again => {},
            }
        }
    }

    fn closeObject(r: *Remote, obj: Object) void {
        r.ops.close.?(r.ops.context, obj.handle);
    }

    /// `.done` on success, `.again` after sleeping before another attempt, `.missing`
    /// when there is no object at `url`, else the error.
    fn retryOrFail(r: *Remote, rc: i32, url: []const u8, message: *[512]u8, attempt: u32) status.Error!enum { done, again, missing } {
        const text = std.mem.sliceTo(message, 0);
        const code = std.meta.intToEnum(Code, rc) catch .failed;
        switch (code) {
            .ok => return .done,
            .retry => if (attempt < r.options.retries) {
                const shift: u6 = @intCast(@min(attempt, 20));
                posix.nanosleep(0, @min(r.options.backoff_ns << shift, 2 * std.time.ns_per_s));
                return .again;
            } else return status.fail(error.Io, "cannot read {s}: still failing after {d} attempts with backoff: {s}", .{ url, attempt + 1, text }),
            .not_found => return .missing,
            .denied => return status.fail(error.Io, "access denied to {s}: the object store refused the credentials (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_PROFILE, or GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_* for other stores): {s}", .{ url, text }),
            .failed => return status.fail(error.Io, "object store error for {s}: {s}", .{ url, text }),
            .changed => return status.fail(error.InvalidCache, "{s} changed on the server while it was read: the object is no longer the version opened (its ETag changed): {s}", .{ url, text }),
        }
    }

    /// Downloads `url` into the new file `name` of `dir`, checking its size (when given)
    /// and SHA-256 against the manifest. The file is removed on any failure.
    ///
    /// The file is preallocated (`fallocate`: a full disk fails here, with a clear error,
    /// never later as a fault on a page of the mapping) and mapped shared. The transport
    /// writes each byte range straight into the file: with `read_file` by positional
    /// writes (the page cache then holds the file in large folios, as for a file written
    /// locally, so the reader's later mappings of it cost a few page-table updates instead
    /// of one per 4 KiB page), else into the mapping with `ops.read`. Either way a
    /// download holds no buffer of its own and the bytes are never copied again by this
    /// process before the reader reads them. With `pool`, up to `parallel_parts` ranges are fetched
    /// at once: the calling thread and pool workers take the next range from a shared
    /// counter. The hash runs while the ranges land: whichever thread completes the range
    /// after the hashed prefix extends the hash in order (see `Fetch.land`), reading the
    /// mapping, so only the last range is hashed after the transfer.
    fn download(r: *Remote, url: [:0]const u8, dir: std.fs.Dir, dir_path: []const u8, name: []const u8, size: ?u64, sha_hex: []const u8, pool: ?*runtime.Pool, stop: ?*const std.atomic.Value(bool)) status.Error!void {
        const obj = try r.openObject(url);
        defer r.closeObject(obj);
        if (size) |expected| if (obj.size != expected) {
            return status.fail(error.InvalidCache, "{s} is {d} bytes but the manifest says {d}: the object was changed or truncated on the server", .{ url, obj.size, expected });
        };
        const file = dir.createFile(name, .{ .exclusive = true, .read = true }) catch |err| return failWrite(err, dir_path, name);
        var keep = false;
        defer {
            file.close();
            if (!keep) dir.deleteFile(name) catch {};
        }
        const read_file = r.read_file.load(.acquire);
        var map: []align(std.heap.page_size_min) u8 = &.{};
        if (obj.size > 0) {
            try preallocate(file, obj.size, dir_path, name);
            const protection: u32 = if (read_file == null) posix.PROT.READ | posix.PROT.WRITE else posix.PROT.READ;
            map = posix.mmap(null, @intCast(obj.size), protection, .{ .TYPE = .SHARED }, file.handle, 0) catch |err| return failWrite(err, dir_path, name);
        }
        defer if (map.len > 0) posix.munmap(map);
        const part: u64 = @max(1, if (stop != null)
            background_range_bytes
        else if (pool == null)
            r.options.chunk_bytes
        else blk: {
            // Ranges of at most range_bytes_max, small enough (down to 1 MiB) that a shard
            // spreads over every participant.
            const spread = std.math.divCeil(u64, obj.size, @max(1, r.options.parallel_parts)) catch unreachable;
            break :blk std.math.clamp(spread, @min(1 << 20, r.options.chunk_bytes), r.options.chunk_bytes);
        });
        const parts = std.math.divCeil(u64, obj.size, part) catch unreachable;
        const landed = try r.gpa.alloc(bool, @intCast(parts));
        defer r.gpa.free(landed);
        @memset(landed, false);
        var fetch: Fetch = .{ .r = r, .obj = obj, .url = url, .map = map, .fd = file.handle, .read_file = read_file, .dir_path = dir_path, .name = name, .part = part, .landed = landed, .hasher = .init(), .stop = stop };
        if (stop != null) {
            // A background fetch (on its own thread, see `Origin`): helper threads of its
            // own, never pool workers, so no pool worker ever waits in the embedder's
            // callbacks for a download nobody waits for.
            var threads: [16]std.Thread = undefined;
            var spawned: usize = 0;
            const want: usize = @intCast(@min(parts -| 1, @min(background_parts -| 1, threads.len)));
            while (spawned < want) : (spawned += 1) {
                threads[spawned] = std.Thread.spawn(.{}, Fetch.work, .{&fetch}) catch break;
            }
            fetch.work();
            for (threads[0..spawned]) |t| t.join();
        } else {
            var helpers: [16]Helper = undefined;
            const helper_count: usize = if (pool == null) 0 else @intCast(@min(parts -| 1, @min(r.options.parallel_parts -| 1, helpers.len)));
            for (helpers[0..helper_count]) |*h| {
                h.* = .{ .fetch = &fetch };
                pool.?.submit(&h.job);
            }
            fetch.work();
            for (helpers[0..helper_count]) |*h| {
                if (pool.?.cancel(&h.job)) continue; // never started: nothing left for it
                fetch.mutex.lock();
                defer fetch.mutex.unlock();
                while (!h.finished) fetch.cond.wait(&fetch.mutex);
            }
        }
        if (fetch.err) |err| return status.failText(err, fetch.message[0..fetch.message_len]);
        std.debug.assert(fetch.hashed == parts);
        const actual = std.fmt.bytesToHex(fetch.hasher.finalResult(), .lower);
        if (!std.mem.eql(u8, &actual, sha_hex)) return status.fail(error.InvalidCache, "checksum mismatch for {s}: the object changed on the server since its manifest was written", .{url});
        keep = true;
    }

    // ------------------------------------------------------------ caches

    /// Fetches the cache at `url` (no trailing slash needed) into the local directory and
    /// returns that directory's path (owned by the caller). With `.every_damaged` checks
    /// (`dataset-rt verify`) it also downloads every shard into the shard cache, and a
    /// damaged or missing file (`metadata.arrow`, `index.bin`, then each shard) does not
    /// stop it: the error names each one on a line of its own (see `cache.Damaged`).
    /// Failures of the store or of this machine (connection, credentials, a full disk)
    /// stop it whatever the checks.
    pub fn fetchCache(r: *Remote, url_in: []const u8, pool: ?*runtime.Pool, checks: cache.Checks) status.Error![]u8 {
        const gpa = r.gpa;
        const url = trimUrl(url_in);
        const manifest_url = try std.fmt.allocPrintSentinel(gpa, "{s}/manifest.json", .{url}, 0);
        defer gpa.free(manifest_url);
        const obj = try r.openObjectIfAny(manifest_url) orelse
            return status.fail(error.InvalidCache, "no cache at {s}: {s} does not exist", .{ url, manifest_url });
        const text = blk: {
            defer r.closeObject(obj);
            if (obj.size > manifest_bytes_max) return status.fail(error.InvalidCache, "manifest is too large: {s}", .{manifest_url});
            const text = try gpa.alloc(u8, @intCast(obj.size));
            errdefer gpa.free(text);
            if (text.len > 0) try r.readObject(obj, manifest_url, 0, text);
            break :blk text;
        };
        defer gpa.free(text);
        var m = try manifest.parse(gpa, text, manifest_url);
        defer m.deinit();
        var damaged: cache.Damaged = .{ .checks = checks };

        var digest: [32]u8 = undefined;
        Sha256.hash(text, &digest);
        const hex = std.fmt.bytesToHex(digest, .lower);
        const final = try std.fmt.allocPrint(gpa, "{s}/caches/{s}", .{ r.root, &hex });
        errdefer gpa.free(final);
        const caches_path = try std.fmt.allocPrint(gpa, "{s}/caches", .{r.root});
        defer gpa.free(caches_path);
        std.fs.cwd().makePath(caches_path) catch |err| return failWrite(err, caches_path, "");
        var caches = std.fs.cwd().openDir(caches_path, .{}) catch |err| return failWrite(err, caches_path, "");
        defer caches.close();
        var present_buf: [80]u8 = undefined;
        const present = std.fmt.bufPrint(&present_buf, "{s}/manifest.json", .{&hex}) catch unreachable;
        if (caches.statFile(present)) |st| {
            const ctime_s: i64 = @intCast(@divFloor(st.ctime, std.time.ns_per_s));
            if (shardcache.changedThisBoot(r.shards.booted, ctime_s) or fetchedIntact(caches, &hex, &m)) {
                if (checks == .every_damaged) try r.fetchShards(url, &m, pool, &damaged);
                try damaged.check();
                return final;
            }
            caches.deleteTree(&hex) catch {}; // lost in a crash: fetched again below
        } else |_| {}

        var tmp_buf: [128]u8 = undefined;
        const tmp_name = std.fmt.bufPrint(&tmp_buf, ".{s}.{d}.{x}.tmp", .{ &hex, std.os.linux.getpid(), std.crypto.random.int(u32) }) catch unreachable;
        caches.makeDir(tmp_name) catch |err| return failWrite(err, caches_path, tmp_name);
        var renamed = false;
        defer if (!renamed) caches.deleteTree(tmp_name) catch {};
        // (`iterate`: a real descriptor, not O_PATH, which flock refuses)
        var tmp = caches.openDir(tmp_name, .{ .iterate = true }) catch |err| return failWrite(err, caches_path, tmp_name);
        defer tmp.close(); // (releases the flock)
        // Held until the directory is renamed or removed: `sweepCacheTemps` of other
        // processes leaves it alone.
        posix.flock(tmp.fd, posix.LOCK.EX) catch |err| return failWrite(err, caches_path, tmp_name);
        const tmp_path = try std.fmt.allocPrint(gpa, "{s}/{s}", .{ caches_path, tmp_name });
        defer gpa.free(tmp_path);
        // In the order a validated open of a local cache checks them. index.bin's size
        // follows from the manifest (a row per sample); metadata.arrow's does not.
        const index_bytes = std.math.mul(u64, m.sample_count, index.row_bytes) catch
            return status.fail(error.InvalidCache, "{s}: sample_count {d} is too large", .{ manifest_url, m.sample_count });
        inline for (.{ .{ "metadata.arrow", m.metadata_sha256, null }, .{ "index.bin", m.index_sha256, index_bytes } }) |file| {
            const file_url = try std.fmt.allocPrintSentinel(gpa, "{s}/{s}", .{ url, file[0] }, 0);
            defer gpa.free(file_url);
            r.download(file_url, tmp, tmp_path, file[0], file[2], file[1], pool, null) catch |err| try noteDamaged(&damaged, err);
        }
        if (checks == .every_damaged) try r.fetchShards(url, &m, pool, &damaged);
        try damaged.check();
        tmp.writeFile(.{ .sub_path = "manifest.json", .data = text }) catch |err| return failWrite(err, tmp_path, "manifest.json");
        caches.rename(tmp_name, &hex) catch |err| switch (err) {
            // Another process fetched the same manifest first: same verified contents.
            error.PathAlreadyExists => return final,
            else => return failWrite(err, caches_path, &hex),
        };
        renamed = true;
        return final;
    }

    /// Downloads (or finds in the shard cache) and verifies every shard of the cache at
    /// `url` whose manifest is `m`, noting each damaged or missing one in `damaged`.
    fn fetchShards(r: *Remote, url: []const u8, m: *const manifest.Manifest, pool: ?*runtime.Pool, damaged: *cache.Damaged) status.Error!void {
        for (m.shards) |*shard| {
            const fd = r.openShard(url, shard, pool) catch |err| {
                try noteDamaged(damaged, err);
                continue;
            };
            posix.close(fd);
        }
    }

    /// Makes room in the shard cache for a download of `need` bytes besides this
    /// process's downloads in flight, and counts it in flight until `unreserve`. A
    /// `background` fetch takes at most half the budget in flight and never waits (false:
    /// no room now); a reader's own fetch waits for downloads in flight when they leave
    /// too little room, then evicts what it must (`makeRoom` with force): the shard
    /// files of this process never exceed the budget.
    fn reserve(r: *Remote, need: u64, what: []const u8, background: bool) status.Error!bool {
        r.mutex.lock();
        defer r.mutex.unlock();
        if (need > r.shards.budget) return r.shards.makeRoom(r.gpa, need, what, true); // the error
        while (true) {
            if (background and r.in_flight + need > r.shards.budget / 2) return false;
            if (r.in_flight + need <= r.shards.budget) {
                if (!try r.shards.makeRoom(r.gpa, r.in_flight + need, what, !background)) return false;
                r.in_flight += need;
                return true;
            }
            r.cond.wait(&r.mutex);
        }
    }

    fn unreserve(r: *Remote, need: u64) void {
        r.mutex.lock();
        defer r.mutex.unlock();
        r.in_flight -= need;
        r.cond.broadcast();
    }

    /// A read-only descriptor of `shard` of the cache at `url`, from the shard cache.
    pub fn openShard(r: *Remote, url: []const u8, shard: *const manifest.Shard, pool: ?*runtime.Pool) status.Error!posix.fd_t {
        return r.fetchShard(url, shard, pool, null);
    }

    /// `openShard`; with `stop`, a background fetch (look-ahead): it gives up when there is
    /// no room in the budget now (see `reserve`) or when `stop` is set.
    fn fetchShard(r: *Remote, url: []const u8, shard: *const manifest.Shard, pool: ?*runtime.Pool, stop: ?*const std.atomic.Value(bool)) status.Error!posix.fd_t {
        const background = stop != null;
        if (try r.shards.lookup(shard.sha256, shard.byte_len)) |fd| return fd;
        const lock = try r.shards.lockShard(shard.sha256);
        defer r.shards.unlockShard(lock);
        // Another process may have downloaded it while this one waited for the lock.
        if (try r.shards.lookup(shard.sha256, shard.byte_len)) |fd| return fd;
        const shard_url = try std.fmt.allocPrintSentinel(r.gpa, "{s}/shards/{s}", .{ trimUrl(url), shard.name }, 0);
        defer r.gpa.free(shard_url);
        if (!try r.reserve(shard.byte_len, shard_url, background)) {
            return status.fail(error.Io, "no room for {s} in the shard cache now: pinned or in flight", .{shard_url});
        }
        defer r.unreserve(shard.byte_len);
        var tmp_buf: [128]u8 = undefined;
        const tmp_name = ShardCache.tempName(&tmp_buf, shard.sha256);
        try r.download(shard_url, r.shards.dir, r.shards.path, tmp_name, shard.byte_len, shard.sha256, pool, stop);
        errdefer r.shards.dir.deleteFile(tmp_name) catch {};
        return r.shards.commit(tmp_name, shard.sha256);
    }
};

/// Notes in `damaged` a download that failed with `err` because the file is damaged or
/// missing (its checksum, its size, no object at its URL: the message of this thread's
/// last error names it); returns any other error (the store, the credentials, this
/// machine), and every error unless the checks name every damaged file.
fn noteDamaged(damaged: *cache.Damaged, err: status.Error) status.Error!void {
    const missing = err == error.Io and std.mem.startsWith(u8, status.lastMessage(), "no object at ");
    if (err != error.InvalidCache and !missing) return err;
    try damaged.note(err);
}

/// Whether the fetched cache `caches/<hex>` (written in an earlier boot, renamed into place
/// without an fsync) still holds its manifest (whose SHA-256 is `hex`) and the index and
/// metadata the manifest `m` names; when it does, its manifest is touched so that it is
/// trusted for the rest of this boot (see `ShardCache`).
fn fetchedIntact(caches: std.fs.Dir, hex: []const u8, m: *const manifest.Manifest) bool {
    var dir = caches.openDir(hex, .{}) catch return false;
    defer dir.close();
    inline for (.{ .{ "index.bin", m.index_sha256 }, .{ "metadata.arrow", m.metadata_sha256 }, .{ "manifest.json", hex } }) |file| {
        const f = dir.openFile(file[0], .{}) catch return false;
        defer f.close();
        if (!shardcache.fileHashes(f.handle, file[1])) return false;
        if (comptime std.mem.eql(u8, file[0], "manifest.json")) posix.futimens(f.handle, null) catch {};
    }
    return true;
}

/// Removes what fetches of processes that died mid-download left in `<root>/caches`:
/// `.<sha>.<pid>.<n>.tmp` directories that no fetch holds locked (`fetchCache` locks its
/// directory right after making it; one made in the last minute is left alone, as its
/// fetch may not have locked it yet). Best effort: a failure leaves the directory.
fn sweepCacheTemps(root: []const u8) void {
    var path_buf: [std.fs.max_path_bytes]u8 = undefined;
    const path = std.fmt.bufPrint(&path_buf, "{s}/caches", .{root}) catch return;
    var caches = std.fs.cwd().openDir(path, .{ .iterate = true }) catch return;
    defer caches.close();
    const now = std.time.nanoTimestamp();
    var it = caches.iterate();
    while (it.next() catch return) |e| {
        if (e.kind != .directory or e.name[0] != '.' or !std.mem.endsWith(u8, e.name, ".tmp")) continue;
        var dir = caches.openDir(e.name, .{ .iterate = true }) catch continue;
        defer dir.close();
        posix.flock(dir.fd, posix.LOCK.EX | posix.LOCK.NB) catch continue; // a fetch in flight
        const st = dir.stat() catch continue;
        if (now - st.mtime < 60 * std.time.ns_per_s) continue;
        caches.deleteTree(e.name) catch {};
    }
}

/// One object being downloaded by several threads (see `Remote.download`) into `map`,
/// the shared mapping of its preallocated temporary file.
const Fetch = struct {
    r: *Remote,
    obj: Remote.Object,
    url: [:0]const u8,
    /// The file, mapped (read only when `read_file` writes it).
    map: []u8,
    fd: posix.fd_t,
    read_file: ?ReadFileFn,
    dir_path: []const u8,
    name: []const u8,
    part: u64,
    /// Set when the download is no longer wanted (a closed cache's look-ahead).
    stop: ?*const std.atomic.Value(bool),
    next: std.atomic.Value(u64) = .init(0),
    failed: std.atomic.Value(bool) = .init(false),
    mutex: std.Thread.Mutex = .{},
    cond: std.Thread.Condition = .{},
    /// Guarded by `mutex`: which ranges are written, how many leading ranges are hashed,
    /// and whether a thread is hashing (one at a time, so the hash sees the bytes in order;
    /// only that thread touches `hasher`).
    landed: []bool,
    hashed: u64 = 0,
    hashing: bool = false,
    hasher: Sha256,
    /// The first failure and its message (messages are per thread: copied here).
    err: ?status.Error = null,
    message: [status.message_bytes_max]u8 = undefined,
    message_len: usize = 0,

    /// Fetches ranges until none is left or one failed.
    fn work(f: *Fetch) void {
        while (!f.failed.load(.acquire)) {
            if (f.stop) |stop| if (stop.load(.acquire)) return f.fail(status.fail(error.Io, "download of {s} stopped: its cache was closed", .{f.url}));
            const i = f.next.fetchAdd(1, .monotonic);
            const offset = i * f.part;
            if (offset >= f.obj.size) return;
            const n: usize = @intCast(@min(f.obj.size - offset, f.part));
            const at: usize = @intCast(offset);
            if (f.read_file) |read_file|
                f.r.readObjectToFile(read_file, f.obj, f.url, offset, n, f.fd) catch |err| return f.fail(err)
            else
                f.r.readObject(f.obj, f.url, offset, f.map[at..][0..n]) catch |err| return f.fail(err);
            f.land(i);
        }
    }

    /// Range `i` is written. Unless another thread is hashing (it sees range `i` before
    /// it stops), hashes every written range after the hashed prefix, in order.
    fn land(f: *Fetch, i: u64) void {
        f.mutex.lock();
        defer f.mutex.unlock();
        f.landed[@intCast(i)] = true;
        if (f.hashing) return;
        f.hashing = true;
        defer f.hashing = false;
        while (f.hashed < f.landed.len and f.landed[@intCast(f.hashed)] and !f.failed.load(.acquire)) {
            const k = f.hashed;
            f.mutex.unlock();
            const offset: usize = @intCast(k * f.part);
            const n: usize = @intCast(@min(f.obj.size - offset, f.part));
            f.hasher.update(f.map[offset..][0..n]);
            f.mutex.lock();
            f.hashed += 1;
        }
    }

    fn fail(f: *Fetch, err: status.Error) void {
        f.mutex.lock();
        defer f.mutex.unlock();
        f.failed.store(true, .release);
        if (f.err != null) return;
        f.err = err;
        const text = if (err == error.OutOfMemory) "out of memory" else status.lastMessage();
        f.message_len = @min(text.len, f.message.len);
        @memcpy(f.message[0..f.message_len], text[0..f.message_len]);
    }
};

/// Reserves `size` bytes of disk for `file`, so that writing through a mapping of it can
/// never fault for want of space. File systems without `fallocate` get the size by
/// `ftruncate` (sparse: a full disk there faults while writing, as with any mapping).
fn preallocate(file: std.fs.File, size: u64, dir_path: []const u8, name: []const u8) status.Error!void {
    const linux = std.os.linux;
    // A size the file system cannot hold fails before any block is allocated (an object
    // of the wrong size would otherwise fill the disk, and other writers with it, before
    // fallocate gave up).
    if (freeBytes(file.handle)) |free| if (size > free) {
        return status.fail(error.Io, "cannot write the local cache {s}/{s}: it needs {d} bytes and the file system has {d} free (free space or raise the quota, or choose another shard cache directory)", .{ dir_path, name, size, free });
    };
    const len = std.math.cast(i64, size) orelse return fileTooLarge(dir_path, name);
    while (true) {
        const rc = linux.fallocate(file.handle, 0, 0, len);
        switch (linux.E.init(rc)) {
            .SUCCESS => return,
            .INTR => continue,
            .OPNOTSUPP, .NOSYS => break,
            .NOSPC => return failWrite(error.NoSpaceLeft, dir_path, name),
            .FBIG => return fileTooLarge(dir_path, name),
            .DQUOT => return failWrite(error.DiskQuota, dir_path, name),
            else => |e| return status.fail(error.Io, "cannot write the local cache {s}/{s}: fallocate failed ({s})", .{ dir_path, name, @tagName(e) }),
        }
    }
    file.setEndPos(size) catch |err| return failWrite(err, dir_path, name);
}

fn fileTooLarge(dir_path: []const u8, name: []const u8) status.Error {
    return status.fail(error.Io, "cannot write the local cache {s}/{s}: File too large (os error 27) (free space or raise the quota, or choose another shard cache directory)", .{ dir_path, name });
}

/// Bytes free on the file system of `fd` (root's reserve included: only a size beyond it
/// is certain to fail), or null when it cannot tell.
fn freeBytes(fd: posix.fd_t) ?u64 {
    // struct statfs of 64-bit Linux (asm-generic and x86_64 alike).
    const Statfs = extern struct { type: i64, bsize: i64, blocks: u64, bfree: u64, bavail: u64, files: u64, ffree: u64, fsid: [2]i32, namelen: i64, frsize: i64, flags: i64, spare: [4]i64 };
    if (@sizeOf(usize) != 8) return null;
    var st: Statfs = undefined;
    const rc = std.os.linux.syscall2(.fstatfs, @as(usize, @bitCast(@as(isize, fd))), @intFromPtr(&st));
    if (std.os.linux.E.init(rc) != .SUCCESS or st.bsize <= 0) return null;
    return std.math.mul(u64, st.bfree, @intCast(st.bsize)) catch null;
}

/// A pool job taking part in a `Fetch`.
const Helper = struct {
    job: runtime.Job = .{ .run = runHelper },
    fetch: *Fetch,
    finished: bool = false,

    fn runHelper(job: *runtime.Job) void {
        const h: *Helper = @fieldParentPtr("job", job);
        const f = h.fetch;
        f.work();
        f.mutex.lock();
        h.finished = true;
        f.cond.broadcast();
        f.mutex.unlock();
    }
};

/// Where a remote cache's shards come from: the transport, the pool that helps fetch, and
/// fetch-ahead (of whole shards here; of records' ranges when iterators read ranges, see
/// `aheadRange`). Two callers hand it the shards that will be read next:
/// - the iterators' plan-order look-ahead (`read/lookahead.zig`, every sampling mode):
///   the shards of the next positions the sampler will draw, through `prefetchShard`;
/// - in ordered reading, opening shard k also asks for shards k+1 .. k+readahead.
/// Each asked-for shard that is not cached is fetched on a thread of its own (at most
/// `slotCount()` at once, each fetching `background_parts` ranges at a time: never on the
/// runtime's pool, whose workers must never wait in the embedder's callbacks for a fetch
/// nobody waits for, for example at interpreter exit); cached or fetched, it is then
/// pinned (`ShardCache.pin`: no process evicts it while anything else can go) until newer
/// look-ahead replaces it (at most `pins_max` pins) or the cache closes. Shards pinned or
/// in flight hold at most half the budget; a shard larger than that is left to the
/// reader's own fetch. A background failure is dropped: the reader's own open of that
/// shard fetches again and reports it. Closing the cache stops fetches in flight after
/// their current range, without waiting for them (they hold a reference to the origin).
const Origin = struct {
    remote: *Remote,
    pool: ?*runtime.Pool,
    readahead: u32,
    /// The cache's URL (owned): background fetches may outlive the cache.
    url: []u8,
    /// One for the cache, one per fetch running or queued; the last frees the origin.
    refs: std.atomic.Value(u32) = .init(1),
    /// Set when the cache closes: fetches in flight stop after their current range.
    closing: std.atomic.Value(bool) = .init(false),
    mutex: std.Thread.Mutex = .{},
    slots: [slots_max]Prefetch = undefined,
    /// Signalled (under `mutex`) when a slot's fetch ends (see `awaitFetch`).
    fetched: std.Thread.Condition = .{},
    /// Guarded by `mutex`: pinned shards (oldest first), and bytes pinned or in flight.
    pins: [pins_max]Pin = undefined,
    pin_count: usize = 0,
    held_bytes: u64 = 0,
    /// Shuffled reading (no ordered read-ahead): with `cache_bytes` over the budget, the
    /// iterators read shards that are not cached by byte ranges (see `readsRanges`).
    shuffled: bool = false,
    /// The bytes of all the cache's shards (set when the cache is open).
    cache_bytes: u64 = 0,
    /// `validate_cache`: every shard is read from a whole copy verified against the
    /// manifest's SHA-256, never by ranges (which no checksum covers).
    validate: bool = false,
    /// Objects opened for range reads, by shard id: kept open (their version pinned, see
    /// `Ops.open`) until the cache closes and the last range fetch ahead ends (the last
    /// reference: `unref`), so every range of a shard comes from the one
    /// version this process first opened. Guarded by `objects_mutex`.
    objects: std.AutoHashMapUnmanaged(u64, Remote.Object) = .empty,
    objects_mutex: std.Thread.Mutex = .{},
    /// Range reads made and bytes they read (tests and statistics).
    range_reads: std.atomic.Value(u64) = .init(0),
    range_bytes: std.atomic.Value(u64) = .init(0),
    /// Range reads ahead (see `aheadRange`), guarded by `mutex`: the records handed on,
    /// their bytes, the sequence number of the next one and one past the newest one a
    /// reader took (an older one still here was passed by: stale), and the threads
    /// fetching them. `ahead_cond` is signalled when a fetch ends.
    ahead: [ahead_max]Ahead = @splat(.{}),
    ahead_bytes: u64 = 0,
    ahead_seq: u64 = 0,
    taken_seq: u64 = 0,
    ahead_workers: usize = 0,
    ahead_cond: std.Thread.Condition = .{},

    const slots_max = 4;
    const pins_max = 8;
    /// Records fetched ahead by range reads at most, and their bytes.
    const ahead_max = 256;
    const ahead_bytes_max = 32 << 20;

    /// A record's byte range fetched ahead into `buf` (owned, as `url`, a copy of the
    /// shard's URL: the cache may close while it is fetched).
    const Ahead = struct {
        state: enum { free, queued, running, landed, failed } = .free,
        shard_id: u64 = 0,
        shard_len: u64 = 0,
        offset: u64 = 0,
        /// Sequence numbers of its first and last hand-on, and the reads it will serve.
        seq: u64 = 0,
        last_seq: u64 = 0,
        uses: u32 = 1,
        buf: []u8 = &.{},
        url: [:0]u8 = undefined,
    };

    const Pin = struct { shard_id: u64, fd: posix.fd_t, bytes: u64 };

    /// A background fetch. It copies what it needs of the shard's manifest entry, so it
    /// never touches the cache, which may close while it runs (the origin stays alive).
    const Prefetch = struct {
        origin: *Origin,
        shard_id: u64 = 0,
        busy: bool = false,
        shard: manifest.Shard = undefined,
        name: [name_max]u8 = undefined,
        sha: [64]u8 = undefined,

        const name_max = 256;

        fn run(p: *Prefetch) void {
            const o = p.origin;
            const fd: ?posix.fd_t = if (o.remote.fetchShard(o.url, &p.shard, null, &o.closing)) |fd|
                o.remote.shards.pinOpen(fd) catch null
            else |_|
                null;
            o.mutex.lock();
            o.held_bytes -= p.shard.byte_len;
            if (fd) |f| {
                if (o.closing.load(.acquire)) posix.close(f) else o.addPin(p.shard_id, f, p.shard.byte_len);
            }
            p.busy = false;
            o.fetched.broadcast();
            o.mutex.unlock();
            o.unref();
        }
    };

    fn unref(o: *Origin) void {
        if (o.refs.fetchSub(1, .acq_rel) != 1) return;
        const r = o.remote;
        for (&o.ahead) |*a| if (a.state != .free) o.dropAhead(a);
        // Closed here, not when the cache closes: a range read ahead may still use one.
        var it = o.objects.valueIterator();
        while (it.next()) |obj| r.closeObject(obj.*);
        o.objects.deinit(r.gpa);
        r.gpa.free(o.url);
        r.gpa.destroy(o);
        r.release();
    }

    /// Fetches ahead at once: half the runtime's workers (at least 1, at most
    /// `slots_max`), so fetch-ahead's requests and buffers scale with the runtime the
    /// user sized.
    fn slotCount(o: *const Origin) usize {
        const workers = if (o.pool) |pool| pool.threads.len else 0;
        return std.math.clamp(workers / 2, 1, slots_max);
    }

    fn isPinned(o: *const Origin, shard_id: u64) bool {
        for (o.pins[0..o.pin_count]) |p| if (p.shard_id == shard_id) return true;
        return false;
    }

    fn isRunning(o: *const Origin, shard_id: u64) bool {
        for (&o.slots) |*slot| if (slot.busy and slot.shard_id == shard_id) return true;
        return false;
    }

    /// Waits while a fetch ahead of shard `shard_id` runs: the reader then finds the
    /// shard pinned and cached (or, when that fetch failed, fetches it itself). Without
    /// this, a reader that reaches the shard before the fetch's thread has taken the
    /// shard's download lock wins the lock and downloads the shard a second way (in
    /// `parallel_parts` ranged GETs, while the fetch ahead waits for the lock): more
    /// requests, and on a server that reads the whole object for a range (moto), several
    /// times the server's work for that shard.
    fn awaitFetch(o: *Origin, shard_id: u64) void {
        o.mutex.lock();
        defer o.mutex.unlock();
        while (o.isRunning(shard_id)) o.fetched.wait(&o.mutex);
    }

    /// Whether opening shard `shard_id` returns without waiting in `awaitFetch` (no fetch
    /// ahead of it runs now; another process's download is not seen).
    fn ready(o: *Origin, shard_id: u64) bool {
        o.mutex.lock();
        defer o.mutex.unlock();
        return !o.isRunning(shard_id);
    }

    /// Under `mutex`. Drops the oldest pin when the table is full.
    fn addPin(o: *Origin, shard_id: u64, fd: posix.fd_t, bytes: u64) void {
        if (o.isPinned(shard_id)) return posix.close(fd);
        if (o.pin_count == pins_max) o.unpinOldest();
        o.pins[o.pin_count] = .{ .shard_id = shard_id, .fd = fd, .bytes = bytes };
        o.pin_count += 1;
        o.held_bytes += bytes;
    }

    /// Under `mutex`.
    fn unpinOldest(o: *Origin) void {
        const p = o.pins[0];
        posix.close(p.fd);
        o.held_bytes -= p.bytes;
        std.mem.copyForwards(Pin, o.pins[0 .. o.pin_count - 1], o.pins[1..o.pin_count]);
        o.pin_count -= 1;
    }

    /// Whether iterators read the shards that are not cached by byte ranges: shuffled
    /// reading of a cache larger than the shard-cache budget, where a shard fetched whole
    /// would be evicted long before the plan came back to most of its records.
    fn iteratorRanges(o: *const Origin) bool {
        return !o.validate and o.shuffled and o.cache_bytes > o.remote.shards.budget;
    }

    /// The read policy: whether `reader` reads shard `shard_id` of `c` by byte ranges
    /// (`readRange`) instead of through a whole verified copy (`Cache.openShard`). Never
    /// with `validate_cache`; a shard that is in the local shard cache is always read
    /// locally; otherwise a lookup (`get_item`) reads ranges, and an iterator reads
    /// ranges when `iteratorRanges`.
    fn readsRanges(o: *Origin, c: *const cache.Cache, shard_id: u64, reader: cache.Reader) bool {
        if (o.validate or (reader == .iterator and !o.iteratorRanges())) return false;
        const shard = &c.manifest.shards[@intCast(shard_id)];
        return !o.remote.shards.contains(shard.sha256, shard.byte_len);
    }

    /// Iterators' look-ahead (`ShardSource.prefetch_range`): the record at `offset`
    /// (`len` bytes) of shard `shard_id` will be read soon. When the iterators read that
    /// shard by ranges, its range is queued and fetched by up to `slotCount()` threads of
    /// their own (never pool workers; detached, each holding a reference) into a buffer
    /// of its own, at most `ahead_max` records and `ahead_bytes_max` bytes at once;
    /// `readRange` then takes the bytes. Records a reader passed by without taking them
    /// (stale) are dropped to make room. A failed fetch is dropped: the reader's own read
    /// reports it.
    fn aheadRange(o: *Origin, c: *const cache.Cache, shard_id: u64, offset: u64, len: u64) cache.RangeAhead {
        if (o.pool == null or !o.iteratorRanges()) return .whole;
        const shard = &c.manifest.shards[@intCast(shard_id)];
        // Left to the reader: empty, out of the shard (it reports it), or too large.
        if (len == 0 or offset > shard.byte_len or len > shard.byte_len - offset or len > ahead_bytes_max / 4) return .taken;
        if (o.remote.shards.contains(shard.sha256, shard.byte_len)) return .whole;
        o.mutex.lock();
        defer o.mutex.unlock();
        if (o.closing.load(.acquire)) return .taken;
        var free: ?*Ahead = null;
        for (&o.ahead) |*a| {
            if (a.state != .free and a.shard_id == shard_id and a.offset == offset and a.buf.len == len) {
                // Drawn again (sampling with replacement): one fetch serves both reads.
                a.uses += 1;
                a.last_seq = o.ahead_seq;
                o.ahead_seq += 1;
                return .taken;
            }
            if ((a.state == .landed or a.state == .failed) and a.last_seq < o.taken_seq) o.dropAhead(a);
            if (a.state == .free and free == null) free = a;
        }
        const a = free orelse return .full;
        if (o.ahead_bytes + len > ahead_bytes_max) return .full;
        const gpa = o.remote.gpa;
        const url = gpa.dupeZ(u8, c.shard_paths[@intCast(shard_id)]) catch return .taken;
        const buf = mem_mod.allocUninit(gpa, @intCast(len)) catch {
            gpa.free(url);
            return .taken;
        };
        a.* = .{ .state = .queued, .shard_id = shard_id, .shard_len = shard.byte_len, .offset = offset, .seq = o.ahead_seq, .last_seq = o.ahead_seq, .buf = buf, .url = url };
        o.ahead_seq += 1;
        o.ahead_bytes += len;
        if (o.ahead_workers < o.slotCount()) {
            _ = o.refs.fetchAdd(1, .monotonic);
            if (std.Thread.spawn(.{}, aheadWork, .{o})) |thread| {
                thread.detach();
                o.ahead_workers += 1;
            } else |_| _ = o.refs.fetchSub(1, .monotonic); // the reader reads it itself
        }
        return .taken;
    }

    /// Under `mutex`: frees the entry `a`.
    fn dropAhead(o: *Origin, a: *Ahead) void {
        std.debug.assert(a.state != .running);
        mem_mod.freeUninit(o.remote.gpa, a.buf);
        o.remote.gpa.free(a.url);
        o.ahead_bytes -= a.buf.len;
        a.* = .{};
    }

    /// A range fetch thread: fetches the oldest queued record until none is left or the
    /// cache closes.
    fn aheadWork(o: *Origin) void {
        defer o.unref();
        o.mutex.lock();
        defer o.mutex.unlock();
        while (!o.closing.load(.acquire)) {
            var next: ?*Ahead = null;
            for (&o.ahead) |*a| {
                if (a.state == .queued and (next == null or a.seq < next.?.seq)) next = a;
            }
            const a = next orelse break;
            a.state = .running;
            o.mutex.unlock();
            const ok = o.fetchRange(a.shard_id, a.url, a.shard_len, a.offset, a.buf);
            o.mutex.lock();
            a.state = if (ok) .landed else .failed;
            o.ahead_cond.broadcast();
        }
        o.ahead_workers -= 1;
    }

    /// One ranged read of the pinned version (see `readRange`); false on any failure.
    fn fetchRange(o: *Origin, shard_id: u64, url: [:0]const u8, shard_len: u64, offset: u64, buf: []u8) bool {
        const obj = o.object(shard_id, url, shard_len) catch return false;
        o.remote.readObject(obj, url, offset, buf) catch return false;
        _ = o.range_reads.fetchAdd(1, .monotonic);
        _ = o.range_bytes.fetchAdd(buf.len, .monotonic);
        return true;
    }

    /// The bytes of `buf.len` at `offset` of shard `shard_id` from a range fetched ahead
    /// (waiting for it while it is fetched); false when there is none (a record queued
    /// but not started is taken off the queue: the caller reads it itself). A record
    /// drawn again stays for its next read.
    fn takeAhead(o: *Origin, shard_id: u64, offset: u64, buf: []u8) bool {
        o.mutex.lock();
        defer o.mutex.unlock();
        const a = for (&o.ahead) |*a| {
            if (a.state != .free and a.shard_id == shard_id and a.offset <= offset and offset - a.offset <= a.buf.len and buf.len <= a.buf.len - (offset - a.offset)) break a;
        } else return false;
        o.taken_seq = @max(o.taken_seq, a.seq + 1);
        while (a.state == .running) o.ahead_cond.wait(&o.mutex);
        const landed = a.state == .landed;
        if (landed) @memcpy(buf, a.buf[@intCast(offset - a.offset)..][0..buf.len]);
        if (landed and a.uses > 1) {
            a.uses -= 1;
            a.seq = a.last_seq; // (with three uses or more, at worst dropped early)
        } else o.dropAhead(a);
        return landed;
    }

    /// Reads `buf.len` bytes at `offset` of shard `shard_id` of `c` with one ranged read
    /// of its object (retried as downloads are), from the version pinned when this origin
    /// first opened that object. The object's size must be the manifest's; the caller
    /// checked the range against it. What this cannot verify: the manifest's SHA-256 is of
    /// the whole shard, so a range is checked only by the pinned version, the size and
    /// the record framing the reader checks when it splits the record.
    fn readRange(o: *Origin, c: *const cache.Cache, shard_id: u64, offset: u64, buf: []u8) status.Error!void {
        const shard = &c.manifest.shards[@intCast(shard_id)];
        const url = c.shard_paths[@intCast(shard_id)];
        if (offset > shard.byte_len or buf.len > shard.byte_len - offset) {
            return status.fail(error.Io, "I/O error: failed to fill whole buffer: {s}", .{url});
        }
        if (buf.len == 0) return;
        if (o.takeAhead(shard_id, offset, buf)) return;
        const obj = try o.object(shard_id, url, shard.byte_len);
        try o.remote.readObject(obj, url, offset, buf);
        _ = o.range_reads.fetchAdd(1, .monotonic);
        _ = o.range_bytes.fetchAdd(buf.len, .monotonic);
    }

    /// The object of shard `shard_id` opened for range reads (opening it on first use).
    fn object(o: *Origin, shard_id: u64, url: [:0]const u8, size: u64) status.Error!Remote.Object {
        {
            o.objects_mutex.lock();
            defer o.objects_mutex.unlock();
            if (o.objects.get(shard_id)) |obj| return obj;
        }
        // Opened outside the lock (a HEAD); a concurrent open of the same shard keeps
        // the first one.
        const obj = try o.remote.openObject(url);
        if (obj.size != size) {
            o.remote.closeObject(obj);
            return status.fail(error.InvalidCache, "{s} is {d} bytes but the manifest says {d}: the object was changed or truncated on the server", .{ url, obj.size, size });
        }
        o.objects_mutex.lock();
        defer o.objects_mutex.unlock();
        const entry = o.objects.getOrPut(o.remote.gpa, shard_id) catch |err| {
            o.remote.closeObject(obj);
            return err;
        };
        if (entry.found_existing) {
            o.remote.closeObject(obj);
            return entry.value_ptr.*;
        }
        entry.value_ptr.* = obj;
        return obj;
    }

    /// Shard `shard_id` of `c` will be read soon: pin it, or start fetching it. False when
    /// it cannot be taken now (every slot busy, or the half budget held by shards in
    /// flight): the caller asks again later. Nothing is fetched whole when iterators read
    /// ranges (`iteratorRanges`).
    fn request(o: *Origin, c: *const cache.Cache, shard_id: u64) bool {
        if (o.pool == null or o.iteratorRanges()) return true;
        const shard = &c.manifest.shards[@intCast(shard_id)];
        const limit = o.remote.shards.budget / 2;
        o.mutex.lock();
        defer o.mutex.unlock();
        if (o.isPinned(shard_id) or o.isRunning(shard_id)) return true;
        // Left to the reader's own fetch: larger than the look-ahead's share, or a name
        // too long to copy.
        if (shard.byte_len > limit or shard.name.len > Prefetch.name_max or shard.sha256.len != 64) return true;
        while (o.held_bytes + shard.byte_len > limit and o.pin_count > 0) o.unpinOldest();
        if (o.held_bytes + shard.byte_len > limit) return false;
        if (o.remote.shards.contains(shard.sha256, shard.byte_len)) {
            o.mutex.unlock();
            const fd = o.remote.shards.pin(shard.sha256, shard.byte_len) catch null;
            o.mutex.lock();
            if (fd) |f| {
                if (o.held_bytes + shard.byte_len > limit) {
                    posix.close(f); // others took the room meanwhile
                    return false;
                }
                o.addPin(shard_id, f, shard.byte_len);
                return true;
            }
            if (o.isPinned(shard_id) or o.isRunning(shard_id)) return true;
        }
        const slot = for (o.slots[0..o.slotCount()]) |*slot| {
            if (!slot.busy) break slot;
        } else return false;
        slot.* = .{ .origin = o, .shard_id = shard_id, .busy = true };
        @memcpy(slot.name[0..shard.name.len], shard.name);
        @memcpy(&slot.sha, shard.sha256);
        slot.shard = shard.*;
        slot.shard.name = slot.name[0..shard.name.len];
        slot.shard.sha256 = &slot.sha;
        _ = o.refs.fetchAdd(1, .monotonic);
        const thread = std.Thread.spawn(.{}, Prefetch.run, .{slot}) catch {
            slot.busy = false;
            _ = o.refs.fetchSub(1, .monotonic);
            return true; // left to the reader's own fetch
        };
        thread.detach();
        o.held_bytes += shard.byte_len;
        return true;
    }

    /// Whether every shard of `c` is pinned by this origin: nothing is left to fetch ahead
    /// and no process can evict any of them until the cache closes (a pin is dropped only
    /// to make room for another shard of the cache, and none is left to request). So once
    /// true it stays true until the cache closes, which the look-ahead relies on.
    fn settled(o: *Origin, c: *const cache.Cache) bool {
        o.mutex.lock();
        defer o.mutex.unlock();
        return o.pin_count == c.manifest.shards.len;
    }

    /// Ordered reading: asks for the shards after `shard_id`.
    fn readAhead(o: *Origin, c: *const cache.Cache, shard_id: u64) void {
        var next = shard_id + 1;
        while (next < c.manifest.shards.len and next <= shard_id + o.readahead) : (next += 1) {
            if (!o.request(c, next)) return;
        }
    }

    /// The cache closes: fetches in flight stop after their current range (without
    /// waiting: they hold their own reference, and a fetch blocked in the embedder's
    /// callback, for example at interpreter exit, must not block the close), and every
    /// pin is dropped.
    fn close(o: *Origin) void {
        o.closing.store(true, .release);
        {
            o.mutex.lock();
            defer o.mutex.unlock();
            while (o.pin_count > 0) o.unpinOldest();
        }
        o.unref(); // the last reference closes the objects opened for range reads
    }
};

/// Opens the remote cache at `url` (fetching and verifying its manifest, index and
/// metadata) as cache `position` of a dataset; its shards come through `r`, which must
/// outlive the cache. In ordered reading (`readahead` > 0), opening a shard also asks
/// for the `readahead` (at most 4) shards after it; in every mode the iterators' look-ahead
/// asks for the shards of the positions they will read next (see `Origin`). `readahead`
/// 0 means shuffled reading (the dataset passes 0 exactly then): with the cache larger
/// than the budget, iterators then read byte ranges (`Origin.iteratorRanges`).
pub fn openCache(r: *Remote, url: []const u8, position: u64, checks: cache.Checks, pool: ?*runtime.Pool, readahead: u32) status.Error!cache.Cache {
    const local = try r.fetchCache(url, pool, checks);
    defer r.gpa.free(local);
    const trimmed = trimUrl(url);
    const origin = try r.gpa.create(Origin);
    errdefer r.gpa.destroy(origin);
    const owned_url = try r.gpa.dupe(u8, trimmed);
    errdefer r.gpa.free(owned_url);
    origin.* = .{ .remote = r, .pool = pool, .url = owned_url, .readahead = if (pool == null) 0 else @min(readahead, Origin.slots_max), .shuffled = readahead == 0, .validate = checks != .structure };
    for (&origin.slots) |*slot| slot.* = .{ .origin = origin };
    const c = try cache.Cache.openRemote(r.gpa, local, position, checks, .{
        .url = trimmed,
        .source = .{
            .context = origin,
            .open = openCacheShard,
            .release = releaseOrigin,
            .prefetch = prefetchShard,
            .settled = settledCache,
            .prefetch_range = prefetchRange,
            .ranges = rangesShard,
            .ready = readyShard,
            .read_range = readRangeShard,
        },
    });
    for (c.manifest.shards) |shard| origin.cache_bytes +|= shard.byte_len;
    _ = r.retain(); // the origin's, released by its last reference
    return c;
}

fn rangesShard(context: *anyopaque, c: *const cache.Cache, shard_id: u64, reader: cache.Reader) bool {
    const origin: *Origin = @ptrCast(@alignCast(context));
    return origin.readsRanges(c, shard_id, reader);
}

fn readRangeShard(context: *anyopaque, c: *const cache.Cache, shard_id: u64, offset: u64, buf: []u8) status.Error!void {
    const origin: *Origin = @ptrCast(@alignCast(context));
    return origin.readRange(c, shard_id, offset, buf);
}

fn openCacheShard(context: *anyopaque, c: *const cache.Cache, shard_id: u64) status.Error!posix.fd_t {
    const origin: *Origin = @ptrCast(@alignCast(context));
    origin.awaitFetch(shard_id);
    const fd = try origin.remote.openShard(c.url.?, &c.manifest.shards[@intCast(shard_id)], origin.pool);
    if (origin.readahead > 0) origin.readAhead(c, shard_id);
    return fd;
}

fn readyShard(context: *anyopaque, _: *const cache.Cache, shard_id: u64) bool {
    const origin: *Origin = @ptrCast(@alignCast(context));
    return origin.ready(shard_id);
}

fn prefetchShard(context: *anyopaque, c: *const cache.Cache, shard_id: u64) bool {
    const origin: *Origin = @ptrCast(@alignCast(context));
    return origin.request(c, shard_id);
}

fn prefetchRange(context: *anyopaque, c: *const cache.Cache, shard_id: u64, offset: u64, len: u64) cache.RangeAhead {
    const origin: *Origin = @ptrCast(@alignCast(context));
    return origin.aheadRange(c, shard_id, offset, len);
}

fn settledCache(context: *anyopaque, c: *const cache.Cache) bool {
    const origin: *Origin = @ptrCast(@alignCast(context));
    return origin.settled(c);
}

fn releaseOrigin(context: *anyopaque) void {
    const origin: *Origin = @ptrCast(@alignCast(context));
    origin.close();
}

/// True for a path that names an object store URL (`scheme://...`).
pub fn isUrl(path: []const u8) bool {
    const i = std.mem.indexOf(u8, path, "://") orelse return false;
    if (i == 0) return false;
    for (path[0..i]) |ch| if (!std.ascii.isAlphanumeric(ch) and ch != '+' and ch != '-' and ch != '.') return false;
    return true;
}

/// `url` without its trailing slashes, but never shorter than its `scheme://` (so that
/// `s3://` + `/manifest.json` names the URL given, not `s3:/manifest.json`).
fn trimUrl(url: []const u8) []const u8 {
    const keep = if (std.mem.indexOf(u8, url, "://")) |i| i + 3 else 0;
    return url[0 .. keep + std.mem.trimRight(u8, url[keep..], "/").len];
}

fn failWrite(err: anyerror, dir_path: []const u8, name: []const u8) status.Error {
    if (err == error.OutOfMemory) return error.OutOfMemory;
    return status.fail(error.Io, "cannot write the local cache {s}/{s}: {s} (free space or raise the quota, or choose another shard cache directory)", .{ dir_path, name, status.describeOsError(err) });
}

// ---------------------------------------------------------------- tests

const testing = std.testing;

/// A transport over a local directory standing in for a bucket: `fake://<dir>/...`
/// URLs; `fail_reads` transient failures before reads succeed. A handle pins the file it
/// opened (its inode, as a store pins an ETag): a read after the file was replaced
/// returns `Code.changed`.
const FakeStore = struct {
    dir: std.fs.Dir,
    fail_reads: u32 = 0,
    reads: std.atomic.Value(u32) = .init(0),
    /// Calls of `readFile` (each also counts in `reads`).
    file_reads: std.atomic.Value(u32) = .init(0),
    opens: u32 = 0,
    /// Handles closed, and calls of `released` with the callbacks in progress then
    /// (`busy`: calls of `open`, `read` and `close` not returned yet).
    closes: std.atomic.Value(u32) = .init(0),
    busy: std.atomic.Value(u32) = .init(0),
    releases: std.atomic.Value(u32) = .init(0),
    busy_at_release: u32 = 0,
    /// A size `open` reports for objects whose name ends so, instead of the file's.
    wrong_size: ?struct { suffix: []const u8, size: u64 } = null,

    const Handle = struct { fd: posix.fd_t, ino: u64, name: []u8 };

    fn ops(fs: *FakeStore) Ops {
        return .{ .context = fs, .open = open, .read = read, .close = close };
    }

    fn rel(url: [*:0]const u8) []const u8 {
        const s = std.mem.span(url);
        return s["fake://".len..];
    }

    fn open(ctx: ?*anyopaque, url: [*:0]const u8, size: *u64, handle: *?*anyopaque, message: [*]u8, cap: u64) callconv(.c) i32 {
        const fs: *FakeStore = @ptrCast(@alignCast(ctx.?));
        _ = fs.busy.fetchAdd(1, .acq_rel);
        defer _ = fs.busy.fetchSub(1, .acq_rel);
        fs.opens += 1;
        const name = rel(url);
        if (std.mem.startsWith(u8, name, "denied/")) return say(message, cap, "403 Forbidden", .denied);
        const f = fs.dir.openFile(name, .{}) catch return say(message, cap, "404 Not Found", .not_found);
        const st = f.stat() catch unreachable;
        const h = testing.allocator.create(Handle) catch unreachable;
        h.* = .{ .fd = f.handle, .ino = st.inode, .name = testing.allocator.dupe(u8, name) catch unreachable };
        size.* = st.size;
        if (fs.wrong_size) |w| if (std.mem.endsWith(u8, name, w.suffix)) {
            size.* = w.size;
        };
        handle.* = h;
        return 0;
    }

    fn read(ctx: ?*anyopaque, handle: ?*anyopaque, offset: u64, buf: [*]u8, len: u64, message: [*]u8, cap: u64) callconv(.c) i32 {
        const fs: *FakeStore = @ptrCast(@alignCast(ctx.?));
        _ = fs.busy.fetchAdd(1, .acq_rel);
        defer _ = fs.busy.fetchSub(1, .acq_rel);
        _ = fs.reads.fetchAdd(1, .monotonic);
        if (fs.fail_reads > 0) {
            fs.fail_reads -= 1;
            return say(message, cap, "connection reset by peer", .retry);
        }
        const h: *Handle = @ptrCast(@alignCast(handle.?));
        const now = fs.dir.statFile(h.name) catch return say(message, cap, "404 Not Found", .not_found);
        if (now.inode != h.ino) return say(message, cap, "412 Precondition Failed", .changed);
        const n = posix.pread(h.fd, buf[0..@intCast(len)], offset) catch return say(message, cap, "read error", .failed);
        if (n != len) return say(message, cap, "short body", .retry);
        return 0;
    }

    /// `ReadFileFn` over `read`: the same failures, then the bytes written into `fd`.
    fn readFile(ctx: ?*anyopaque, handle: ?*anyopaque, offset: u64, len: u64, fd: i32, message: [*]u8, cap: u64) callconv(.c) i32 {
        const fs: *FakeStore = @ptrCast(@alignCast(ctx.?));
        _ = fs.file_reads.fetchAdd(1, .monotonic);
        const buf = testing.allocator.alloc(u8, @intCast(len)) catch return say(message, cap, "out of memory", .failed);
        defer testing.allocator.free(buf);
        const rc = read(ctx, handle, offset, buf.ptr, len, message, cap);
        if (rc != 0) return rc;
        const n = posix.pwrite(fd, buf, offset) catch return say(message, cap, "write error", .failed);
        if (n != len) return say(message, cap, "short write", .failed);
        return 0;
    }

    fn close(ctx: ?*anyopaque, handle: ?*anyopaque) callconv(.c) void {
        const fs: *FakeStore = @ptrCast(@alignCast(ctx.?));
        _ = fs.busy.fetchAdd(1, .acq_rel);
        defer _ = fs.busy.fetchSub(1, .acq_rel);
        const h: *Handle = @ptrCast(@alignCast(handle.?));
        posix.close(h.fd);
        testing.allocator.free(h.name);
        testing.allocator.destroy(h);
        _ = fs.closes.fetchAdd(1, .acq_rel);
    }

    /// `ReleaseFn`: counts, and notes the callbacks still in progress.
    fn released(ctx: ?*anyopaque) callconv(.c) void {
        const fs: *FakeStore = @ptrCast(@alignCast(ctx.?));
        fs.busy_at_release = fs.busy.load(.acquire);
        _ = fs.releases.fetchAdd(1, .acq_rel);
    }

    fn say(message: [*]u8, cap: u64, text: []const u8, code: Code) i32 {
        const n = @min(text.len, cap - 1);
        @memcpy(message[0..n], text[0..n]);
        message[n] = 0;
        return @intFromEnum(code);
    }
};

fn hexOf(bytes: []const u8) [64]u8 {
    var d: [32]u8 = undefined;
    Sha256.hash(bytes, &d);
    return std.fmt.bytesToHex(d, .lower);
}

test "isUrl" {
    try testing.expect(isUrl("s3://bucket/a"));
    try testing.expect(isUrl("gs://b"));
    try testing.expect(!isUrl("/tmp/s3://x"));
    try testing.expect(!isUrl("relative/path"));
    try testing.expect(!isUrl("://x"));
    try testing.expectEqualStrings("s3://b/p", trimUrl("s3://b/p//"));
    try testing.expectEqualStrings("s3://", trimUrl("s3://"));
    try testing.expectEqualStrings("s3://", trimUrl("s3:////"));
}

test "shards download once, verified, retried, and the errors name the URL" {
    try checkDownloads(false);
}

test "downloads written by the transport's read_file: the same bytes, checks and errors" {
    try checkDownloads(true);
}

/// Downloads through `ops.read` into the mapping, or through `read_file` (`FakeStore.readFile`).
fn checkDownloads(with_read_file: bool) !void {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    try tmp.dir.makePath("bucket/c/shards");
    try tmp.dir.makePath("local");
    const data = "0123456789abcdef" ** 100;
    try tmp.dir.writeFile(.{ .sub_path = "bucket/c/shards/shard_000000.bin", .data = data });
    const root = try tmp.dir.realpathAlloc(testing.allocator, "local");
    defer testing.allocator.free(root);
    var store: FakeStore = .{ .dir = tmp.dir };
    const r = try Remote.create(testing.allocator, store.ops(), .{ .root = root, .budget = 1 << 20, .backoff_ns = 1000, .chunk_bytes = 100 });
    defer r.release();
    if (with_read_file) r.setReadFile(FakeStore.readFile);
    const hex = hexOf(data);
    var shard: manifest.Shard = .{ .name = "shard_000000.bin", .uncompressed_byte_len = data.len, .byte_len = data.len, .compression = .none, .ratio = 1, .sha256 = &hex };

    // Two transient failures mid-file: retried, and the bytes are right.
    store.fail_reads = 2;
    const fd = try r.openShard("fake://bucket/c", &shard, null);
    var back: [data.len]u8 = undefined;
    try testing.expectEqual(@as(usize, data.len), try posix.pread(fd, &back, 0));
    posix.close(fd);
    try testing.expectEqualStrings(data, &back);
    // In parallel ranges on a pool (13 ranges of 100 bytes, 2 workers and the caller).
    const rt = try runtime.Runtime.open(testing.allocator, 2);
    defer rt.release();
    const data1 = "fedcba9876543210" ** 81;
    try tmp.dir.writeFile(.{ .sub_path = "bucket/c/shards/shard_000001.bin", .data = data1 });
    const hex1 = hexOf(data1);
    const shard1: manifest.Shard = .{ .name = "shard_000001.bin", .uncompressed_byte_len = data1.len, .byte_len = data1.len, .compression = .none, .ratio = 1, .sha256 = &hex1 };
    const fd1 = try r.openShard("fake://bucket/c", &shard1, &rt.pool);
    var back1: [data1.len]u8 = undefined;
    try testing.expectEqual(@as(usize, data1.len), try posix.pread(fd1, &back1, 0));
    posix.close(fd1);
    try testing.expectEqualStrings(data1, &back1);
    // Cached: no further open.
    const opens = store.opens;
    posix.close(try r.openShard("fake://bucket/c", &shard, null));
    try testing.expectEqual(opens, store.opens);

    // Changed on the server (same size, other bytes): not cached, nothing left behind.
    var other = shard;
    const other_hex = hexOf("x" ** 1600);
    other.sha256 = &other_hex;
    try testing.expectError(error.InvalidCache, r.openShard("fake://bucket/c", &other, null));
    try testing.expect(std.mem.indexOf(u8, status.lastMessage(), "checksum mismatch for fake://bucket/c/shards/shard_000000.bin") != null);
    // Truncated on the server.
    other.byte_len = data.len + 1;
    try testing.expectError(error.InvalidCache, r.openShard("fake://bucket/c", &other, null));
    try testing.expect(std.mem.indexOf(u8, status.lastMessage(), "changed or truncated") != null);
    // Transient failures that do not stop.
    store.fail_reads = 100;
    var third = shard;
    const third_hex = hexOf("y");
    third.sha256 = &third_hex;
    try testing.expectError(error.Io, r.openShard("fake://bucket/c", &third, null));
    try testing.expect(std.mem.indexOf(u8, status.lastMessage(), "cannot read fake://bucket/c/shards/shard_000000.bin: still failing after 6 attempts") != null);
    store.fail_reads = 0;
    // 404 and 403.
    try testing.expectError(error.Io, r.openShard("fake://bucket/missing", &third, null));
    try testing.expect(std.mem.indexOf(u8, status.lastMessage(), "no object at fake://bucket/missing/shards/") != null);
    try testing.expectError(error.Io, r.fetchCache("fake://denied/c", null, .structure));
    try testing.expect(std.mem.indexOf(u8, status.lastMessage(), "access denied to fake://denied/c/manifest.json") != null);
    try testing.expectError(error.InvalidCache, r.fetchCache("fake://bucket/none", null, .structure));
    try testing.expect(std.mem.indexOf(u8, status.lastMessage(), "no cache at fake://bucket/none") != null);
    // Only the verified shard is in the shard cache: no temporary files.
    var it = r.shards.dir.iterate();
    var bins: u32 = 0;
    while (try it.next()) |e| {
        try testing.expect(!std.mem.endsWith(u8, e.name, ".tmp"));
        if (std.mem.endsWith(u8, e.name, ".bin")) bins += 1;
    }
    try testing.expectEqual(@as(u32, 2), bins);
    // Every download went the way asked.
    try testing.expectEqual(with_read_file, store.file_reads.load(.monotonic) > 0);
}

/// Copies the reference cache `name` (tests/fixtures) into `<dir>/bucket/<name>`;
/// returns its shards' total and largest byte counts.
fn copyFixture(dir: std.fs.Dir, name: []const u8) !struct { total: u64, largest: u64 } {
    const fixtures: []const u8 = @import("build_options").fixtures_dir;
    var src = try (try std.fs.cwd().openDir(fixtures, .{})).openDir(name, .{ .iterate = true });
    defer src.close();
    var dst_buf: [256]u8 = undefined;
    try dir.makePath(try std.fmt.bufPrint(&dst_buf, "bucket/{s}/shards", .{name}));
    var dst = try dir.openDir(try std.fmt.bufPrint(&dst_buf, "bucket/{s}", .{name}), .{});
    defer dst.close();
    var walker = try src.walk(testing.allocator);
    defer walker.deinit();
    var total: u64 = 0;
    var largest: u64 = 0;
    while (try walker.next()) |e| {
        if (e.kind != .file) continue;
        try src.copyFile(e.path, dst, e.path, .{});
        if (std.mem.startsWith(u8, e.path, "shards/")) {
            const size = (try src.statFile(e.path)).size;
            total += size;
            largest = @max(largest, size);
        }
    }
    return .{ .total = total, .largest = largest };
}

/// A test's fake object store and shard cache: a temporary directory whose objects the
/// store serves (paths under it are URLs `fake://<path>`) and whose `local/` is the root.
const Bucket = struct {
    tmp: testing.TmpDir,
    root: []u8,
    store: FakeStore,

    fn init() !Bucket {
        var tmp = testing.tmpDir(.{});
        errdefer tmp.cleanup();
        try tmp.dir.makePath("local");
        const root = try tmp.dir.realpathAlloc(testing.allocator, "local");
        return .{ .tmp = tmp, .root = root, .store = .{ .dir = tmp.dir } };
    }

    fn deinit(b: *Bucket) void {
        testing.allocator.free(b.root);
        b.tmp.cleanup();
    }
};

test "range reads: the policy, the bytes of every record, the pinned version and the size" {
    const gpa = testing.allocator;
    var b = try Bucket.init();
    defer b.deinit();
    const name = "plain_many_shards";
    const url = "fake://bucket/" ++ name;
    const sizes = try copyFixture(b.tmp.dir, name);
    const rt = try runtime.Runtime.open(gpa, 2);
    defer rt.release();
    // Room for three shards, far less than the cache.
    const r = try Remote.create(gpa, b.store.ops(), .{ .root = b.root, .budget = 3 * sizes.largest, .backoff_ns = 1000 });
    defer r.release();
    try testing.expect(3 * sizes.largest < sizes.total);
    var ordered = try openCache(r, url, 0, .structure, &rt.pool, 2);
    defer ordered.close();
    var shuffled = try openCache(r, url, 0, .structure, &rt.pool, 0);
    defer shuffled.close();
    const shard_count = ordered.manifest.shards.len;

    // On a cold shard cache: lookups read ranges; iterators only when shuffled.
    for (0..shard_count) |id| {
        try testing.expect(ordered.readsRanges(id, .lookup) and shuffled.readsRanges(id, .lookup));
        try testing.expect(!ordered.readsRanges(id, .iterator) and shuffled.readsRanges(id, .iterator));
    }
    // Shuffled look-ahead over the budget fetches nothing whole.
    for (0..shard_count) |id| try testing.expect(prefetchShard(shuffled.source.?.context, &shuffled, id));
    // Every record by its own range: the bytes of the shard file there.
    var record: std.ArrayList(u8) = .empty;
    defer record.deinit(gpa);
    var path_buf: [256]u8 = undefined;
    for (0..@intCast(ordered.sampleCount())) |sid| {
        const row = ordered.row(sid);
        try record.resize(gpa, @intCast(row.byte_len));
        try ordered.readRange(row.shard_id, row.offset, record.items);
        const path = try std.fmt.bufPrint(&path_buf, "bucket/{s}/shards/{s}", .{ name, ordered.manifest.shards[@intCast(row.shard_id)].name });
        const file = try b.tmp.dir.openFile(path, .{});
        defer file.close();
        var want: [1 << 16]u8 = undefined;
        try testing.expectEqual(record.items.len, try file.preadAll(want[0..record.items.len], row.offset));
        try testing.expectEqualSlices(u8, want[0..record.items.len], record.items);
    }
    const origin: *Origin = @ptrCast(@alignCast(ordered.source.?.context));
    try testing.expect(origin.range_reads.load(.monotonic) > 0);
    try testing.expectEqual(shard_count, origin.objects.count()); // one open object per shard
    try testing.expectEqual(@as(usize, 0), try countBins(r));
    // Past the shard's end: refused before any request.
    try testing.expectError(error.Io, ordered.readRange(0, ordered.manifest.shards[0].byte_len, record.items[0..1]));

    // A shard in the local shard cache is read locally, by lookups and iterators alike.
    posix.close(try shuffled.openShard(0)); // (no read-ahead: only shard 0 is fetched)
    try testing.expect(!ordered.readsRanges(0, .lookup) and !shuffled.readsRanges(0, .iterator));
    try testing.expect(shuffled.readsRanges(1, .iterator));
    // A cache that fits the budget: shuffled iterators fetch whole shards.
    {
        const roomy = try Remote.create(gpa, b.store.ops(), .{ .root = b.root, .budget = 2 * sizes.total, .backoff_ns = 1000 });
        defer roomy.release();
        var fits = try openCache(roomy, url, 0, .structure, &rt.pool, 0);
        defer fits.close();
        try testing.expect(!fits.readsRanges(1, .iterator) and fits.readsRanges(1, .lookup));
    }
    // validate_cache: whole verified shards only, for lookups too.
    {
        var checked = try openCache(r, url, 0, .first_damaged, &rt.pool, 0);
        defer checked.close();
        try testing.expect(!checked.readsRanges(1, .iterator) and !checked.readsRanges(1, .lookup));
    }

    // The object replaced on the server between two ranges of this reader: "changed",
    // never bytes of the other version; putting the old bytes back (a new object again)
    // does not help this reader, whose version is gone.
    var fresh = try openCache(r, url, 0, .structure, &rt.pool, 0);
    defer fresh.close();
    // Two records of one shard (not shard 0, which is cached).
    var first: u64 = 0;
    while (fresh.row(first).shard_id == 0 or fresh.row(first + 1).shard_id != fresh.row(first).shard_id) first += 1;
    const second = first + 1;
    const changed = fresh.row(first).shard_id;
    try record.resize(gpa, @intCast(fresh.row(first).byte_len));
    try fresh.readRange(changed, fresh.row(first).offset, record.items);
    const shard_path = try std.fmt.bufPrint(&path_buf, "bucket/{s}/shards/{s}", .{ name, fresh.manifest.shards[@intCast(changed)].name });
    const old = try b.tmp.dir.readFileAlloc(gpa, shard_path, 1 << 20);
    defer gpa.free(old);
    const zeros = try gpa.alloc(u8, old.len);
    defer gpa.free(zeros);
    @memset(zeros, 0);
    for ([_][]const u8{ zeros, old }) |bytes| {
        try b.tmp.dir.writeFile(.{ .sub_path = "replacement", .data = bytes });
        try b.tmp.dir.rename("replacement", shard_path); // a new object: a new inode (ETag)
        try record.resize(gpa, @intCast(fresh.row(second).byte_len));
        try testing.expectError(error.InvalidCache, fresh.readRange(changed, fresh.row(second).offset, record.items));
        const message = status.lastMessage();
        try testing.expect(std.mem.indexOf(u8, message, "fake://bucket/" ++ name ++ "/shards/") != null);
        try testing.expect(std.mem.indexOf(u8, message, "changed on the server while it was read") != null);
    }
    // Truncated before this reader opened it: the size check, before any range.
    const truncated: u64 = if (changed == 1) 2 else 1;
    const shard2 = try std.fmt.bufPrint(&path_buf, "bucket/{s}/shards/{s}", .{ name, fresh.manifest.shards[@intCast(truncated)].name });
    const whole = try b.tmp.dir.readFileAlloc(gpa, shard2, 1 << 20);
    defer gpa.free(whole);
    try b.tmp.dir.writeFile(.{ .sub_path = shard2, .data = whole[0 .. whole.len - 1] });
    const reads = b.store.reads.load(.monotonic);
    try testing.expectError(error.InvalidCache, fresh.readRange(truncated, 0, record.items[0..1]));
    try testing.expect(std.mem.indexOf(u8, status.lastMessage(), "bytes but the manifest says") != null);
    try testing.expectEqual(reads, b.store.reads.load(.monotonic));
    try testing.expectEqual(@as(usize, 1), try countBins(r)); // shard 0, fetched whole above
}

test "verify's fetch: every file downloaded and checked, each damaged or missing one on a line; failures of the store stop it" {
    const gpa = testing.allocator;
    var b = try Bucket.init();
    defer b.deinit();
    const name = "plain_many_shards";
    const url = "fake://bucket/" ++ name;
    const sizes = try copyFixture(b.tmp.dir, name);
    const r = try Remote.create(gpa, b.store.ops(), .{ .root = b.root, .budget = 2 * sizes.total, .backoff_ns = 1000 });
    defer r.release();
    const rt = try runtime.Runtime.open(gpa, 2);
    defer rt.release();
    var bucket = try b.tmp.dir.openDir("bucket/" ++ name, .{});
    defer bucket.close();
    const flip = struct {
        fn at(dir: std.fs.Dir, path: []const u8) !void {
            const file = try dir.openFile(path, .{ .mode = .read_write });
            defer file.close();
            var byte: [1]u8 = undefined;
            _ = try file.preadAll(&byte, 10);
            byte[0] ^= 1;
            try file.pwriteAll(&byte, 10);
        }
    }.at;

    // Several, in a validated local open's order: metadata.arrow, index.bin, the shards.
    try flip(bucket, "metadata.arrow");
    try bucket.rename("shards/000004.bin", "000004.bin"); // missing on the server
    try flip(bucket, "shards/000009.bin");
    const changed = ": the object changed on the server since its manifest was written";
    const nine = "checksum mismatch for " ++ url ++ "/shards/000009.bin" ++ changed;
    try testing.expectError(error.InvalidCache, r.fetchCache(url, &rt.pool, .every_damaged));
    var lines = std.mem.splitScalar(u8, status.lastMessage(), '\n');
    try testing.expectEqualStrings("checksum mismatch for " ++ url ++ "/metadata.arrow" ++ changed, lines.next().?);
    try testing.expect(std.mem.startsWith(u8, lines.next().?, "no object at " ++ url ++ "/shards/000004.bin: 404 Not Found"));
    try testing.expectEqualStrings(nine, lines.next().?);
    try testing.expectEqual(null, lines.next());
    // Without naming every file: the first, and no shard is fetched.
    const opens = b.store.opens;
    try testing.expectError(error.InvalidCache, r.fetchCache(url, &rt.pool, .first_damaged));
    try testing.expect(std.mem.endsWith(u8, status.lastMessage(), "/metadata.arrow" ++ changed));
    try testing.expectEqual(opens + 2, b.store.opens); // the manifest and metadata.arrow
    // Nothing published in caches/; the intact shards are in the shard cache.
    var caches = try std.fs.cwd().openDir(b.root, .{});
    defer caches.close();
    var listing = try caches.openDir("caches", .{ .iterate = true });
    defer listing.close();
    var it = listing.iterate();
    try testing.expectEqual(null, try it.next());
    var shards = try bucket.openDir("shards", .{ .iterate = true });
    defer shards.close();
    var shard_files: usize = 0;
    var names = shards.iterate();
    while (try names.next()) |_| shard_files += 1;
    try testing.expectEqual(shard_files - 1, try countBins(r)); // all the server has but 000009.bin

    // One damaged file: its own error, as reading would find it.
    try flip(bucket, "metadata.arrow");
    try bucket.rename("000004.bin", "shards/000004.bin");
    try testing.expectError(error.InvalidCache, r.fetchCache(url, &rt.pool, .every_damaged));
    try testing.expectEqualStrings(nine, status.lastMessage());

    // A failure of the store is no damaged file: it stops the checks at once.
    b.store.fail_reads = 100;
    defer b.store.fail_reads = 0;
    try testing.expectError(error.Io, r.fetchCache(url, null, .every_damaged));
    try testing.expect(std.mem.indexOf(u8, status.lastMessage(), "still failing after") != null);
    try testing.expectEqual(@as(usize, 0), std.mem.count(u8, status.lastMessage(), "\n"));
}

fn countBins(r: *Remote) !usize {
    var n: usize = 0;
    var it = r.shards.dir.iterate();
    while (try it.next()) |e| {
        if (std.mem.endsWith(u8, e.name, ".bin")) n += 1;
    }
    return n;
}

test "sizes the store reports are checked before anything is allocated: index.bin's against the manifest, any against the free space" {
    const gpa = testing.allocator;
    var b = try Bucket.init();
    defer b.deinit();
    _ = try copyFixture(b.tmp.dir, "plain_one_shard");
    const url = "fake://bucket/plain_one_shard";
    const r = try Remote.create(gpa, b.store.ops(), .{ .root = b.root, .budget = 1 << 30, .backoff_ns = 1000 });
    defer r.release();
    b.store.wrong_size = .{ .suffix = "/index.bin", .size = 5 };
    try testing.expectError(error.InvalidCache, r.fetchCache(url, null, .structure));
    try testing.expect(std.mem.startsWith(u8, status.lastMessage(), url ++ "/index.bin is 5 bytes but the manifest says "));
    // No size is too large to be refused with an error (an i64 length for fallocate).
    for ([_]u64{ std.math.maxInt(u64), std.math.maxInt(i64) + 1, 1 << 60 }) |size| {
        b.store.wrong_size = .{ .suffix = "/metadata.arrow", .size = size };
        try testing.expectError(error.Io, r.fetchCache(url, null, .structure));
        try testing.expect(std.mem.indexOf(u8, status.lastMessage(), "/metadata.arrow: it needs ") != null);
        try testing.expect(std.mem.indexOf(u8, status.lastMessage(), " bytes and the file system has ") != null);
    }
    b.store.wrong_size = null;
    const local = try r.fetchCache(url, null, .structure);
    gpa.free(local);
}

test "settled: a cache is settled once every shard is pinned, never with more shards than pins" {
    const gpa = testing.allocator;
    var b = try Bucket.init();
    defer b.deinit();
    const one = try copyFixture(b.tmp.dir, "plain_one_shard");
    const many = try copyFixture(b.tmp.dir, "plain_many_shards");
    const rt = try runtime.Runtime.open(gpa, 2);
    defer rt.release();
    const r = try Remote.create(gpa, b.store.ops(), .{ .root = b.root, .budget = 4 * (one.total + many.total), .backoff_ns = 1000 });
    defer r.release();

    var single = try openCache(r, "fake://bucket/plain_one_shard", 0, .structure, &rt.pool, 0);
    defer single.close();
    const src = single.source.?;
    try testing.expect(!src.settled.?(src.context, &single)); // nothing fetched or pinned
    try testing.expect(src.prefetch.?(src.context, &single, 0));
    // The fetch runs on a thread of its own and pins the shard when it lands.
    var waited: u32 = 0;
    while (!src.settled.?(src.context, &single)) : (waited += 1) {
        try testing.expect(waited < 10_000);
        posix.nanosleep(0, std.time.ns_per_ms);
    }

    // More shards than pins: never settled, whatever was asked for.
    var several = try openCache(r, "fake://bucket/plain_many_shards", 0, .structure, &rt.pool, 0);
    defer several.close();
    try testing.expect(several.manifest.shards.len > Origin.pins_max);
    for (0..several.manifest.shards.len) |id| {
        _ = several.source.?.prefetch.?(several.source.?.context, &several, id);
        try testing.expect(!several.source.?.settled.?(several.source.?.context, &several));
    }
    // Background fetches end before the test does (the allocator checks what they free).
    const origin: *Origin = @ptrCast(@alignCast(several.source.?.context));
    waited = 0;
    while (origin.refs.load(.acquire) > 1) : (waited += 1) {
        try testing.expect(waited < 10_000);
        posix.nanosleep(0, std.time.ns_per_ms);
    }
}

test "range reads ahead: fetched on their own threads, taken by the reader, stale ones dropped" {
    const gpa = testing.allocator;
    var b = try Bucket.init();
    defer b.deinit();
    const name = "plain_many_shards";
    const sizes = try copyFixture(b.tmp.dir, name);
    const rt = try runtime.Runtime.open(gpa, 2);
    defer rt.release();
    const r = try Remote.create(gpa, b.store.ops(), .{ .root = b.root, .budget = 3 * sizes.largest, .backoff_ns = 1000 });
    defer r.release();
    var ordered = try openCache(r, "fake://bucket/" ++ name, 0, .structure, &rt.pool, 2);
    defer ordered.close();
    var shuffled = try openCache(r, "fake://bucket/" ++ name, 0, .structure, &rt.pool, 0);
    const src = shuffled.source.?;
    const origin: *Origin = @ptrCast(@alignCast(src.context));
    const ahead = src.prefetch_range.?;

    // Whole shards where iterators read them whole; a record out of its shard is left
    // to the reader, which reports it.
    const row0 = ordered.row(0);
    try testing.expectEqual(cache.RangeAhead.whole, ordered.source.?.prefetch_range.?(ordered.source.?.context, &ordered, row0.shard_id, row0.offset, row0.byte_len));
    try testing.expectEqual(cache.RangeAhead.taken, ahead(src.context, &shuffled, 0, shuffled.manifest.shards[0].byte_len, 1));

    // Records 0..n handed on, fetched without any reader, then read from there.
    const n: u64 = @min(shuffled.sampleCount(), 12);
    for (0..n) |sid| {
        const row = shuffled.row(sid);
        try testing.expectEqual(cache.RangeAhead.taken, ahead(src.context, &shuffled, row.shard_id, row.offset, row.byte_len));
    }
    var waited: u32 = 0;
    while (origin.range_reads.load(.monotonic) < n) : (waited += 1) {
        try testing.expect(waited < 10_000);
        posix.nanosleep(0, std.time.ns_per_ms);
    }
    const reads = b.store.reads.load(.monotonic);
    var record: std.ArrayList(u8) = .empty;
    defer record.deinit(gpa);
    var want: std.ArrayList(u8) = .empty;
    defer want.deinit(gpa);
    var sid: u64 = n;
    while (sid > 1) {
        sid -= 1; // newest first: taking record 1 leaves record 0 stale
        const row = shuffled.row(sid);
        try record.resize(gpa, @intCast(row.byte_len));
        try want.resize(gpa, @intCast(row.byte_len));
        try shuffled.readRange(row.shard_id, row.offset, record.items);
        try ordered.readRange(row.shard_id, row.offset, want.items); // a read of its own
        try testing.expectEqualSlices(u8, want.items, record.items);
    }
    // One request per record: the ones `ordered` made; none by `shuffled`'s reads.
    try testing.expectEqual(reads + (n - 1), b.store.reads.load(.monotonic));
    // Record 0 was passed by: dropped when the next record is handed on.
    const last = shuffled.row(n);
    try testing.expectEqual(cache.RangeAhead.taken, ahead(src.context, &shuffled, last.shard_id, last.offset, last.byte_len));
    {
        origin.mutex.lock();
        defer origin.mutex.unlock();
        var live: usize = 0;
        for (&origin.ahead) |*a| {
            if (a.state != .free) live += 1;
            try testing.expect(!(a.state != .free and a.shard_id == row0.shard_id and a.offset == row0.offset));
        }
        try testing.expectEqual(@as(usize, 1), live);
    }
    // Drawn again (sampling with replacement): one request serves both reads.
    try testing.expectEqual(cache.RangeAhead.taken, ahead(src.context, &shuffled, last.shard_id, last.offset, last.byte_len));
    waited = 0;
    while (origin.range_reads.load(.monotonic) < n + 1) : (waited += 1) {
        try testing.expect(waited < 10_000);
        posix.nanosleep(0, std.time.ns_per_ms);
    }
    try want.resize(gpa, @intCast(last.byte_len));
    try ordered.readRange(last.shard_id, last.offset, want.items);
    const before = b.store.reads.load(.monotonic);
    for (0..2) |_| {
        try record.resize(gpa, @intCast(last.byte_len));
        @memset(record.items, 0);
        try shuffled.readRange(last.shard_id, last.offset, record.items);
        try testing.expectEqualSlices(u8, want.items, record.items);
    }
    try testing.expectEqual(before, b.store.reads.load(.monotonic));
    // The fetch threads end when nothing is queued, dropping their references; then the
    // close frees every buffer (the allocator checks it).
    waited = 0;
    while (origin.refs.load(.acquire) > 1) : (waited += 1) {
        try testing.expect(waited < 10_000);
        posix.nanosleep(0, std.time.ns_per_ms);
    }
    shuffled.close();
}

test "a reader that reaches a shard being fetched ahead waits for that fetch (the shard is not ready): one download, no requests of its own" {
    const gpa = testing.allocator;
    var b = try Bucket.init();
    defer b.deinit();
    const sizes = try copyFixture(b.tmp.dir, "plain_many_shards");
    const rt = try runtime.Runtime.open(gpa, 2);
    defer rt.release();
    const r = try Remote.create(gpa, b.store.ops(), .{ .root = b.root, .budget = 4 * sizes.total, .backoff_ns = 1000 });
    defer r.release();
    var c = try openCache(r, "fake://bucket/plain_many_shards", 0, .structure, &rt.pool, 2);
    defer c.close();
    const origin: *Origin = @ptrCast(@alignCast(c.source.?.context));
    // A fetch ahead of shard 0 that has not reached the shard's download lock yet (its
    // thread not scheduled): the slot is taken, nothing is requested.
    {
        origin.mutex.lock();
        defer origin.mutex.unlock();
        origin.slots[0] = .{ .origin = origin, .shard_id = 0, .busy = true };
    }
    const Reader = struct {
        fn run(cache_: *cache.Cache, fd: *posix.fd_t, done: *std.atomic.Value(bool)) void {
            fd.* = cache_.openShard(0) catch -1;
            done.store(true, .release);
        }
    };
    // An iterator would deliver its reads in flight before opening shard 0 (not ready).
    try testing.expect(!c.shardReady(0) and c.shardReady(1));
    var fd: posix.fd_t = -1;
    var done: std.atomic.Value(bool) = .init(false);
    const reads = b.store.reads.load(.monotonic);
    const thread = try std.Thread.spawn(.{}, Reader.run, .{ &c, &fd, &done });
    posix.nanosleep(0, 200 * std.time.ns_per_ms);
    // The reader waits for the fetch: no download of its own.
    try testing.expect(!done.load(.acquire));
    try testing.expectEqual(reads, b.store.reads.load(.monotonic));
    // The fetch ends (here: without the shard, as a failed fetch ahead does): the reader
    // fetches the shard itself and reads it.
    {
        origin.mutex.lock();
        defer origin.mutex.unlock();
        origin.slots[0].busy = false;
        origin.fetched.broadcast();
    }
    thread.join();
    try testing.expect(c.shardReady(0));
    try testing.expect(fd >= 0);
    defer posix.close(fd);
    try testing.expect(b.store.reads.load(.monotonic) > reads);
    try testing.expect(r.shards.contains(c.manifest.shards[0].sha256, c.manifest.shards[0].byte_len));
    // Background fetches (read-ahead of shards 1 and 2) end before the test does.
    var waited: u32 = 0;
    while (origin.refs.load(.acquire) > 1) : (waited += 1) {
        try testing.expect(waited < 10_000);
        posix.nanosleep(0, std.time.ns_per_ms);
    }
}

test "release: called once after the last reference, the fetches ahead's included; no callback follows" {
    const gpa = testing.allocator;
    var b = try Bucket.init();
    defer b.deinit();
    const sizes = try copyFixture(b.tmp.dir, "plain_many_shards");
    const rt = try runtime.Runtime.open(gpa, 2);
    defer rt.release();
    const r = try Remote.create(gpa, b.store.ops(), .{ .root = b.root, .budget = 4 * sizes.total, .backoff_ns = 1000 });
    r.setRelease(FakeStore.released);
    var c = try openCache(r, "fake://bucket/plain_many_shards", 0, .structure, &rt.pool, 2);
    // Fetches ahead of the first shards, on threads of their own, then everything closed
    // at once: the fetches still hold references.
    for (0..Origin.slots_max) |id| _ = c.source.?.prefetch.?(c.source.?.context, &c, id);
    c.close();
    r.release();
    var waited: u32 = 0;
    while (b.store.releases.load(.acquire) == 0) : (waited += 1) {
        try testing.expect(waited < 10_000);
        posix.nanosleep(0, std.time.ns_per_ms);
    }
    try testing.expectEqual(@as(u32, 0), b.store.busy_at_release);
    try testing.expectEqual(b.store.opens, b.store.closes.load(.acquire));
    try testing.expect(b.store.reads.load(.acquire) > 0);
    const reads = b.store.reads.load(.acquire);
    posix.nanosleep(0, 50 * std.time.ns_per_ms);
    try testing.expectEqual(reads, b.store.reads.load(.acquire));
    try testing.expectEqual(@as(u32, 1), b.store.releases.load(.acquire));
}

test "what fetches of dead processes left in caches/ is removed, what a fetch holds is not" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    const root = try tmp.dir.realpathAlloc(testing.allocator, ".");
    defer testing.allocator.free(root);
    const old = [2]posix.timespec{ .{ .sec = 1000, .nsec = 0 }, .{ .sec = 1000, .nsec = 0 } };
    for ([_][]const u8{ "caches/.aa.1.1.tmp", "caches/.bb.1.1.tmp", "caches/.cc.1.1.tmp", "caches/dd" }) |sub| {
        try tmp.dir.makePath(sub);
        var d = try tmp.dir.openDir(sub, .{ .iterate = true });
        defer d.close();
        try d.writeFile(.{ .sub_path = "index.bin", .data = "1234" });
        if (!std.mem.endsWith(u8, sub, "cc.1.1.tmp")) try posix.futimens(d.fd, &old);
    }
    // ".bb" is held by a fetch (this process, through another descriptor), ".cc" was just
    // made (its fetch may not hold it yet), "dd" is a fetched cache.
    var held = try tmp.dir.openDir("caches/.bb.1.1.tmp", .{ .iterate = true });
    defer held.close();
    try posix.flock(held.fd, posix.LOCK.EX);
    sweepCacheTemps(root);
    try testing.expectError(error.FileNotFound, tmp.dir.statFile("caches/.aa.1.1.tmp"));
    for ([_][]const u8{ "caches/.bb.1.1.tmp/index.bin", "caches/.cc.1.1.tmp/index.bin", "caches/dd/index.bin" }) |sub| {
        _ = try tmp.dir.statFile(sub);
    }
}

test "a fetched cache from an earlier boot is used only while its files are intact" {
    var tmp = testing.tmpDir(.{});
    defer tmp.cleanup();
    _ = try copyFixture(tmp.dir, "plain_one_shard");
    var caches = try tmp.dir.openDir("bucket", .{});
    defer caches.close();
    const text = try caches.readFileAlloc(testing.allocator, "plain_one_shard/manifest.json", 1 << 20);
    defer testing.allocator.free(text);
    var m = try manifest.parse(testing.allocator, text, "manifest.json");
    defer m.deinit();
    // Fetched caches are named by their manifest's SHA-256.
    var digest: [32]u8 = undefined;
    Sha256.hash(text, &digest);
    const hex = std.fmt.bytesToHex(digest, .lower);
    try caches.rename("plain_one_shard", &hex);
    try testing.expect(fetchedIntact(caches, &hex, &m));
    var sub_buf: [96]u8 = undefined;
    // Each file at its size but zeros, as a crash can leave a file never written back.
    for ([_][]const u8{ "manifest.json", "index.bin" }) |name| {
        const sub = try std.fmt.bufPrint(&sub_buf, "{s}/{s}", .{ &hex, name });
        const kept = try caches.readFileAlloc(testing.allocator, sub, 1 << 20);
        defer testing.allocator.free(kept);
        const zeros = try testing.allocator.alloc(u8, kept.len);
        defer testing.allocator.free(zeros);
        @memset(zeros, 0);
        try caches.writeFile(.{ .sub_path = sub, .data = zeros });
        try testing.expect(!fetchedIntact(caches, &hex, &m));
        try caches.writeFile(.{ .sub_path = sub, .data = kept });
        try testing.expect(fetchedIntact(caches, &hex, &m));
    }
}
