//! Opening one cache directory: parse `manifest.json`, check the structure the reference
//! checks at load (exact shard sizes, `metadata.arrow` present, index shape and shard
//! ids), map `index.bin`, and with `validate_cache` verify every SHA-256 first.
//!
//! Check order (it decides which message a multiply-broken cache reports, as in the
//! reference): manifest → shard sizes → metadata.arrow present → checksums and then
//! metadata.arrow rows and kinds (validate only) → index length → index row count →
//! shard ids.

const std = @import("std");
const posix = std.posix;
const schema = @import("../format/schema.zig");
const status = @import("../base/status.zig");
const manifest = @import("../format/manifest.zig");
const index = @import("../format/index.zig");
const arrow = @import("../format/arrow.zig");
const publish = @import("publish.zig");

/// A cache's `metadata.arrow`, mapped and parsed (columns point into the mapping).
pub const Metadata = struct {
    map: []align(std.heap.page_size_min) const u8,
    file: arrow.File,
    /// Whether the file's columns are the manifest's fields by name, in order.
    columns_match: bool,

    /// Maps and parses `<cache>/metadata.arrow`, then checks it against the manifest the
    /// way the reference's validation does: row count first, then each manifest field's
    /// kind against the Arrow column at the same position.
    fn load(gpa: std.mem.Allocator, dir: posix.fd_t, cache_path: []const u8, m: *const manifest.Manifest) status.Error!Metadata {
        const path = try std.fmt.allocPrintSentinel(gpa, "{s}/metadata.arrow", .{std.mem.trimRight(u8, cache_path, "/")}, 0);
        defer gpa.free(path);
        const file = try publish.openRegular(dir, "metadata.arrow", path);
        defer file.close();
        const map = try publish.mapFile(file, path);
        errdefer publish.unmapFile(map);
        var parsed = arrow.File.parse(gpa, map) catch |err| return switch (err) {
            error.InvalidCache, error.Arrow => status.nameFile(err, path),
            else => err,
        };
        errdefer parsed.deinit(gpa);
        if (parsed.row_count != m.sample_count) return status.fail(error.InvalidCache, "metadata row count does not match manifest: {s}", .{path});
        for (m.fields, 0..) |f, i| {
            const actual: ?schema.Kind = if (i < parsed.fields.len) parsed.fields[i].type.kind() else null;
            if (actual != f.kind) return status.fail(error.InvalidCache, "metadata '{s}' is not {s}: {s}", .{ f.name, f.kind.name(), path });
        }
        // Past the reference's checks (which a validated open makes, and no more), those
        // of `get_metadata` (metadata.py), made when the columns are used (`columns`).
        var columns_match = parsed.fields.len == m.fields.len;
        if (columns_match) for (m.fields, parsed.fields) |f, actual| {
            columns_match = columns_match and std.mem.eql(u8, actual.name, f.name);
        };
        return .{ .map = map, .file = parsed, .columns_match = columns_match };
    }

    fn deinit(md: *Metadata, gpa: std.mem.Allocator) void {
        md.file.deinit(gpa);
        publish.unmapFile(md.map);
    }
};

/// Who reads a record: an iterator (plan order) or a lookup (`get_item`); a remote
/// cache's read policy (`ShardSource.ranges`) tells them apart.
pub const Reader = enum { iterator, lookup };

/// The largest `manifest.json` a cache may have (64 MiB: about 400,000 shards).
pub const manifest_bytes_max = 64 << 20;

/// Where the shards of a cache fetched from object storage come from (the I/O layer's
/// remote transport, `io/remote.zig`): `open` returns a read-only descriptor of a verified
/// local copy of shard `shard_id`; or, when `ranges` says so, the reader reads the bytes
/// of its records with `read_range` (byte-range reads, no local copy).
pub const ShardSource = struct {
    context: *anyopaque,
    open: *const fn (context: *anyopaque, c: *const Cache, shard_id: u64) status.Error!posix.fd_t,
    /// Frees `context` when the cache closes.
    release: ?*const fn (context: *anyopaque) void = null,
    /// Shard `shard_id` will be read soon (an iterator's plan-order look-ahead): start
    /// fetching it in the background. False: not now (fetches or memory at their bound),
    /// ask again later.
    prefetch: ?*const fn (context: *anyopaque, c: *const Cache, shard_id: u64) bool = null,
    /// A record of shard `shard_id` (`len` bytes at `offset`) will be read soon by an
    /// iterator (plan-order look-ahead): see `RangeAhead`.
    prefetch_range: ?*const fn (context: *anyopaque, c: *const Cache, shard_id: u64, offset: u64, len: u64) RangeAhead = null,
    /// True when no shard of `c` needs fetching ahead now (every one is local and pinned):
    /// the look-ahead skips the cache instead of locating every position it will read.
    /// Once true it must stay true until the cache closes (the look-ahead asks no more).
    settled: ?*const fn (context: *anyopaque, c: *const Cache) bool = null,
    /// Whether `reader` reads shard `shard_id` now by byte ranges (`read_range`) rather
    /// than through `open`. Cheap when the answer is no for a whole cache.
    ranges: ?*const fn (context: *anyopaque, c: *const Cache, shard_id: u64, reader: Reader) bool = null,
    /// Whether `open` of shard `shard_id` would return without waiting for a download
    /// that is under way (a fetch ahead of it runs now): an iterator with reads in flight
    /// delivers those first instead of waiting. A hint only; null: always.
    ready: ?*const fn (context: *anyopaque, c: *const Cache, shard_id: u64) bool = null,
    /// Reads `buf.len` bytes at `offset` of shard `shard_id` (a range inside the
    /// manifest's length) from object storage into `buf`.
    read_range: ?*const fn (context: *anyopaque, c: *const Cache, shard_id: u64, offset: u64, buf: []u8) status.Error!void = null,
};

/// What a shard source does with a record the look-ahead hands on (`prefetch_range`).
pub const RangeAhead = enum {
    /// Its shard is read whole: hand on the shard (`prefetch`).
    whole,
    /// Its bytes are fetched ahead by a range read, or left to the reader's own read.
    taken,
    /// Not now (range reads ahead at their bound): ask again later.
    full,
};

/// A cache on object storage: its URL, and where its shards come from.
pub const RemoteOrigin = struct {
    url: []const u8,
    source: ShardSource,
};

pub const Cache = struct {
    gpa: std.mem.Allocator,
    /// The path as given by the caller (no trailing slash added or removed); for a remote
    /// cache, the local directory holding its manifest, index and metadata.
    path: []u8,
    /// A remote cache's URL (owned) and shard source; null for a local cache.
    url: ?[]u8 = null,
    source: ?ShardSource = null,
    manifest: manifest.Manifest,
    cache_id: u64,
    /// Mapped `index.bin` (read-only, private); empty when the cache has no rows.
    index_map: []align(std.heap.page_size_min) const u8,
    /// NUL-terminated `<path>/shards/<name>` for every shard.
    shard_paths: [][:0]u8,
    /// metadata.arrow, loaded at open with validate_cache, else on first need (a JSON
    /// null float to resolve). `metadata_mutex` guards the lazy load; once `metadata_ready`
    /// is set the value never changes, so readers use it without the lock.
    metadata: ?Metadata = null,
    /// Identity of the cache directory when it was opened. Files opened later are opened
    /// relative to the directory only while the path still names this directory, so a
    /// cache rebuilt in place (DRT_WRITER_REPLACE) is never mixed with the old one.
    dir_dev: u64,
    dir_ino: u64,
    metadata_ready: std.atomic.Value(bool) = .init(false),
    metadata_mutex: std.Thread.Mutex = .{},

    /// Opens the cache at `path`. `position` is its index in the dataset's path list (the
    /// cache id of a format-2 manifest).
    pub fn open(gpa: std.mem.Allocator, path: []const u8, position: u64, validate: bool) status.Error!Cache {
        return openWith(gpa, path, position, if (validate) .first_damaged else .structure, null);
    }

    /// A validated open (as `open` with `validate`) that does not stop at the first
    /// damaged file: every shard's size, `metadata.arrow`'s presence and every SHA-256
    /// are checked, and the error names each damaged file on a line of its own
    /// ("checksum mismatch for <path>", ...; past the message's bound, "... and N more
    /// damaged files"). For `dataset-rt verify`.
    pub fn openNamingDamaged(gpa: std.mem.Allocator, path: []const u8, position: u64) status.Error!Cache {
        return openWith(gpa, path, position, .every_damaged, null);
    }

    /// Opens a remote cache whose manifest, index and metadata were fetched (and verified)
    /// into `local_dir`. Its shards are not there: `remote.source` supplies verified
    /// copies, so shard sizes and checksums are checked when each is fetched, not here.
    pub fn openRemote(gpa: std.mem.Allocator, local_dir: []const u8, position: u64, validate: bool, remote: RemoteOrigin) status.Error!Cache {
        return openWith(gpa, local_dir, position, if (validate) .first_damaged else .structure, remote);
    }

    fn openWith(gpa: std.mem.Allocator, path: []const u8, position: u64, checks: Checks, remote: ?RemoteOrigin) status.Error!Cache {
        const validate = checks != .structure;
        const own_path = try gpa.dupe(u8, path);
        errdefer gpa.free(own_path);

        var dir = std.fs.cwd().openDir(path, .{ .iterate = true }) catch |err| switch (err) {
            error.FileNotFound, error.NotDir => {
                const manifest_path = try joinPath(gpa, path, "manifest.json");
                defer gpa.free(manifest_path);
                return status.fail(error.InvalidCache, "missing manifest: {s}", .{manifest_path});
            },
            else => return status.failIo(err, path),
        };
        defer dir.close();

        const manifest_path = try joinPath(gpa, path, "manifest.json");
        defer gpa.free(manifest_path);
        const manifest_file = publish.openRegular(dir.fd, "manifest.json", manifest_path) catch |err| {
            if (err == error.Io and std.mem.startsWith(u8, status.lastMessage(), "I/O error: No such file or directory")) {
                return status.fail(error.InvalidCache, "missing manifest: {s}", .{manifest_path});
            }
            return err;
        };
        defer manifest_file.close();
        const text = manifest_file.readToEndAlloc(gpa, manifest_bytes_max) catch |err| switch (err) {
            error.OutOfMemory => return error.OutOfMemory,
            error.FileTooBig => return status.fail(error.InvalidCache, "manifest is too large: {s}", .{manifest_path}),
            else => return status.failIo(err, manifest_path),
        };
        defer gpa.free(text);
        var m = try manifest.parse(gpa, text, manifest_path);
        errdefer m.deinit();

        const shard_paths = try gpa.alloc([:0]u8, m.shards.len);
        var made: usize = 0;
        errdefer {
            for (shard_paths[0..made]) |p| gpa.free(p);
            gpa.free(shard_paths);
        }
        const shard_base = if (remote) |r| std.mem.trimRight(u8, r.url, "/") else path;
        for (m.shards, shard_paths) |shard, *p| {
            p.* = try std.fmt.allocPrintSentinel(gpa, "{s}/shards/{s}", .{ shard_base, shard.name }, 0);
            made += 1;
        }
        // With `.every_damaged`, a damaged file's error is noted and the checks go on.
        var damaged: Damaged = .{ .checks = checks };
        // Shards (local ones) whose size is wrong: not hashed too.
        const sized_wrong = try gpa.alloc(bool, if (remote == null) m.shards.len else 0);
        defer gpa.free(sized_wrong);
        @memset(sized_wrong, true);
        if (remote == null) for (m.shards, shard_paths, sized_wrong) |shard, p, *wrong| {
            // (fstatat: std's statFile treats a name longer than NAME_MAX as unreachable)
            const st = posix.fstatatZ(posix.AT.FDCWD, p, 0) catch |err| {
                try damaged.note(status.failIo(err, p));
                continue;
            };
            if (st.size != shard.byte_len) {
                try damaged.note(status.fail(error.InvalidCache, "shard length mismatch for {s}", .{p}));
                continue;
            }
            wrong.* = false;
        };
        const metadata_present = if (dir.statFile("metadata.arrow")) |_| true else |err| blk: {
            try damaged.note(status.fail(error.Io, "I/O error: {s}: {s}/metadata.arrow", .{ status.describeOsError(err), path }));
            break :blk false;
        };

        if (validate) {
            if (metadata_present) verifyFile(gpa, dir, "metadata.arrow", path, m.metadata_sha256) catch |err| try damaged.note(err);
            verifyFile(gpa, dir, "index.bin", path, m.index_sha256) catch |err| try damaged.note(err);
            if (remote == null) for (m.shards, shard_paths, sized_wrong) |shard, p, wrong| {
                if (!wrong) verifySha(p, shard.sha256) catch |err| try damaged.note(err);
            };
        }
        try damaged.check();

        const dir_stat = posix.fstat(dir.fd) catch |err| return status.failIo(err, path);
        var metadata: ?Metadata = null;
        if (validate) metadata = try Metadata.load(gpa, dir.fd, path, &m);
        errdefer if (metadata) |*md| md.deinit(gpa);

        const index_map = try mapIndex(gpa, dir, path, m.sample_count, m.shards.len);
        errdefer if (index_map.len > 0) posix.munmap(index_map);
        const url = if (remote) |r| try gpa.dupe(u8, r.url) else null;
        return .{
            .gpa = gpa,
            .path = own_path,
            .url = url,
            .source = if (remote) |r| r.source else null,
            .manifest = m,
            .cache_id = m.cache_id orelse position,
            .index_map = index_map,
            .shard_paths = shard_paths,
            .metadata = metadata,
            .dir_dev = dir_stat.dev,
            .dir_ino = dir_stat.ino,
            .metadata_ready = .init(validate),
        };
    }

    /// The parsed metadata.arrow, loading it on first use. Thread-safe. Its columns are
    /// taken by position, so they must be the manifest's fields by name too, as
    /// `get_metadata` checks them (a validated open checks only the reference's rules).
    pub fn metadataFile(c: *Cache) status.Error!*const arrow.File {
        if (!c.metadata_ready.load(.acquire)) {
            c.metadata_mutex.lock();
            defer c.metadata_mutex.unlock();
            if (!c.metadata_ready.load(.acquire)) {
                const dir = try c.openSameDir();
                defer posix.close(dir);
                c.metadata = try Metadata.load(c.gpa, dir, c.path, &c.manifest);
                c.metadata_ready.store(true, .release);
            }
        }
        const md = &c.metadata.?;
        if (!md.columns_match) {
            if (md.file.fields.len != c.manifest.fields.len) return status.fail(error.InvalidCache, "metadata batch column count does not match manifest: {s}/metadata.arrow", .{std.mem.trimRight(u8, c.path, "/")});
            for (c.manifest.fields, md.file.fields) |f, actual| if (!std.mem.eql(u8, actual.name, f.name)) {
                return status.fail(error.InvalidCache, "metadata column '{s}' does not match manifest schema: {s}/metadata.arrow", .{ f.name, std.mem.trimRight(u8, c.path, "/") });
            };
        }
        return &md.file;
    }

    /// An O_PATH descriptor of the cache directory, provided the path still names the
    /// directory that was opened; otherwise the cache was replaced (rebuilt) or removed.
    fn openSameDir(c: *const Cache) status.Error!posix.fd_t {
        const path_z = try c.gpa.dupeZ(u8, c.path);
        defer c.gpa.free(path_z);
        const fd = posix.openZ(path_z, .{ .ACCMODE = .RDONLY, .DIRECTORY = true, .PATH = true, .CLOEXEC = true }, 0) catch |err| switch (err) {
            error.FileNotFound, error.NotDir => return c.replacedError(),
            else => return status.failIo(err, c.path),
        };
        errdefer posix.close(fd);
        const st = posix.fstat(fd) catch |err| return status.failIo(err, c.path);
        if (st.dev != c.dir_dev or st.ino != c.dir_ino) return c.replacedError();
        return fd;
    }

    const replaced_format = "cache {s} was replaced (rebuilt) or removed while this dataset was open; open it again";

    fn replacedError(c: *const Cache) status.Error {
        return status.fail(error.InvalidCache, replaced_format, .{c.path});
    }

    /// Whether `msg` is this cache's `replacedError` (a read's error that is not about
    /// one record: no shard is named after it).
    pub fn isReplacedMessage(c: *const Cache, msg: []const u8) bool {
        const head = comptime replaced_format[0..std.mem.indexOf(u8, replaced_format, "{s}").?];
        const tail = comptime replaced_format[std.mem.indexOf(u8, replaced_format, "{s}").? + 3 ..];
        return msg.len == head.len + c.path.len + tail.len and std.mem.startsWith(u8, msg, head) and
            std.mem.eql(u8, msg[head.len..][0..c.path.len], c.path) and std.mem.endsWith(u8, msg, tail);
    }

    /// Opens shard `shard_id` of this very cache (see `openSameDir`).
    pub fn openShard(c: *const Cache, shard_id: u64) status.Error!posix.fd_t {
        if (c.source) |src| return src.open(src.context, c, shard_id);
        const dir = try c.openSameDir();
        defer posix.close(dir);
        const name = c.manifest.shards[@intCast(shard_id)].name;
        var buf: [std.fs.max_path_bytes]u8 = undefined;
        const rel = std.fmt.bufPrintZ(&buf, "shards/{s}", .{name}) catch return status.fail(error.InvalidCache, "shard name too long", .{});
        return posix.openatZ(dir, rel, .{ .ACCMODE = .RDONLY, .CLOEXEC = true }, 0) catch |err| switch (err) {
            // The directory removed meanwhile (a rebuild), or this one shard missing.
            error.FileNotFound => if (c.openSameDir()) |again| blk: {
                posix.close(again);
                break :blk status.failIo(err, c.shard_paths[@intCast(shard_id)]);
            } else |replaced| replaced,
            else => status.failIo(err, c.shard_paths[@intCast(shard_id)]),
        };
    }

    /// Whether `openShard(shard_id)` returns without waiting for a download under way
    /// (`ShardSource.ready`). Always true for a local cache.
    pub fn shardReady(c: *const Cache, shard_id: u64) bool {
        const src = c.source orelse return true;
        const ready = src.ready orelse return true;
        return ready(src.context, c, shard_id);
    }

    /// Whether `reader` reads the records of shard `shard_id` with `readRange` (a remote
    /// cache's shard that is not in the local shard cache, by the policy of
    /// `io/remote.zig`) instead of through `openShard`. Always false for a local cache.
    pub fn readsRanges(c: *const Cache, shard_id: u64, reader: Reader) bool {
        const src = c.source orelse return false;
        const ranges = src.ranges orelse return false;
        return ranges(src.context, c, shard_id, reader);
    }

    /// Reads `buf.len` bytes at `offset` of shard `shard_id` by a byte-range read from
    /// object storage (see `readsRanges`). The caller checked the range against the
    /// manifest's shard length, and checks the record framing when it splits the bytes.
    pub fn readRange(c: *const Cache, shard_id: u64, offset: u64, buf: []u8) status.Error!void {
        const src = c.source.?;
        return src.read_range.?(src.context, c, shard_id, offset, buf);
    }

    pub fn close(c: *Cache) void {
        if (c.metadata) |*md| md.deinit(c.gpa);
        if (c.index_map.len > 0) posix.munmap(c.index_map);
        for (c.shard_paths) |p| c.gpa.free(p);
        c.gpa.free(c.shard_paths);
        if (c.url) |u| c.gpa.free(u);
        if (c.source) |src| if (src.release) |release| release(src.context);
        c.manifest.deinit();
        c.gpa.free(c.path);
    }

    pub fn sampleCount(c: *const Cache) u64 {
        return c.manifest.sample_count;
    }

    pub fn row(c: *const Cache, sample_id: u64) index.Row {
        return index.get(c.index_map, sample_id);
    }
};

/// `dir/name` without doubling a trailing slash of `dir` (so "/" gives "/manifest.json").
fn joinPath(gpa: std.mem.Allocator, dir: []const u8, name: []const u8) error{OutOfMemory}![]u8 {
    const sep = if (dir.len > 0 and dir[dir.len - 1] == '/') "" else "/";
    return std.fmt.allocPrint(gpa, "{s}{s}{s}", .{ dir, sep, name });
}

fn mapIndex(gpa: std.mem.Allocator, dir: std.fs.Dir, path: []const u8, sample_count: u64, shard_count: usize) status.Error![]align(std.heap.page_size_min) const u8 {
    const index_path = try joinPath(gpa, path, "index.bin");
    defer gpa.free(index_path);
    const file = try publish.openRegular(dir.fd, "index.bin", index_path);
    defer file.close();
    const size = (file.stat() catch |err| return status.failIo(err, index_path)).size;
    if (size % index.row_bytes != 0) return status.fail(error.InvalidCache, "index length is not divisible by row size: {s}", .{index_path});
    if (size / index.row_bytes != sample_count) return status.fail(error.InvalidCache, "index row count does not match manifest: {s}", .{index_path});
    if (size == 0) return &.{};
    const map = posix.mmap(null, @intCast(size), posix.PROT.READ, .{ .TYPE = .PRIVATE }, file.handle, 0) catch |err| return status.failIo(err, index_path);
    errdefer posix.munmap(map);
    var i: u64 = 0;
    while (i < sample_count) : (i += 1) {
        const shard_id = index.get(map, i).shard_id;
        if (shard_id >= shard_count) return status.fail(error.InvalidCache, "index references missing shard {d}: {s}", .{ shard_id, index_path });
    }
    return map;
}

/// What an open checks: the structure only, also every SHA-256 (stopping at the first
/// damaged file), or every SHA-256 naming each damaged file.
const Checks = enum { structure, first_damaged, every_damaged };

/// The damaged files an `.every_damaged` open found: their errors' messages, one per
/// line, within the bound of an error message (`status.message_bytes_max`); past it
/// they are counted.
const Damaged = struct {
    checks: Checks,
    text: [status.message_bytes_max - tail_bytes]u8 = undefined,
    len: usize = 0,
    count: usize = 0,
    /// Files noted past the bound.
    more: usize = 0,

    /// Room kept for the last line ("... and N more damaged files").
    const tail_bytes = 64;

    /// Notes the file whose check failed with `err` (its message is this thread's last
    /// error) when the open names every damaged file; otherwise, or for running out of
    /// memory, returns `err`.
    fn note(d: *Damaged, err: status.Error) status.Error!void {
        if (d.checks != .every_damaged or err == error.OutOfMemory) return err;
        const line = status.lastMessage();
        d.count += 1;
        const sep: usize = @intFromBool(d.len > 0);
        if (d.more == 0 and d.len + sep + line.len <= d.text.len) {
            if (sep == 1) d.text[d.len] = '\n';
            @memcpy(d.text[d.len + sep ..][0..line.len], line);
            d.len += sep + line.len;
        } else if (d.len == 0) {
            // One line longer than the bound: its start, cut on a UTF-8 boundary.
            var keep = d.text.len;
            while (keep > 0 and (line[keep] & 0xC0) == 0x80) keep -= 1;
            @memcpy(d.text[0..keep], line[0..keep]);
            d.len = keep;
        } else d.more += 1;
    }

    /// Fails with every noted file (`error.InvalidCache`) when there is any.
    fn check(d: *const Damaged) status.Error!void {
        if (d.count == 0) return;
        if (d.more == 0) return status.fail(error.InvalidCache, "{s}", .{d.text[0..d.len]});
        return status.fail(error.InvalidCache, "{s}\n... and {d} more damaged files", .{ d.text[0..d.len], d.more });
    }
};

fn verifyFile(gpa: std.mem.Allocator, dir: std.fs.Dir, name: []const u8, cache_path: []const u8, expected_hex: []const u8) status.Error!void {
    const full = try std.fmt.allocPrintSentinel(gpa, "{s}/{s}", .{ cache_path, name }, 0);
    defer gpa.free(full);
    _ = dir;
    try verifySha(full, expected_hex);
}

/// Fails with "checksum mismatch for <path>" unless the file's SHA-256 is `expected_hex`.
fn verifySha(path: [:0]const u8, expected_hex: []const u8) status.Error!void {
    try publish.verifyDigest((try publish.hashPath(path)).sha256, expected_hex, path);
}
