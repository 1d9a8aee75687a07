//! Opening one cache directory: parse `manifest.json`, check the structure the reference
//! checks at load (exact shard sizes, `metadata.arrow` present, index shape and shard
//! ids), map `index.bin`, and with `validate_cache` verify every SHA-256 first.
//!
//! Check order (it decides which message a multiply-broken cache reports, as in the
//! reference): manifest → without validate_cache, every shard's size then metadata.arrow
//! present; with it, metadata.arrow present and its SHA-256 → index.bin's SHA-256 → each
//! shard's size and SHA-256, shard by shard → metadata.arrow rows and kinds → (both)
//! index length → index row count → shard ids.

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
    /// cache id of a format-2 manifest). `checks` (see `Checks`): the structure only, as
    /// 0.4.8 unvalidated; also every SHA-256, failing at the first damaged file in 0.4.8's
    /// order (`metadata.arrow`, `index.bin`, each shard); or, for `dataset-rt verify`,
    /// all of them, the error naming each damaged file on a line of its own ("checksum
    /// mismatch for <path>", ...; past the message's bound, "... and N more damaged
    /// files"; one damaged file fails as it does alone).
    pub fn open(gpa: std.mem.Allocator, path: []const u8, position: u64, checks: Checks) status.Error!Cache {
        return openWith(gpa, path, position, checks, null);
    }

    /// Opens a remote cache whose manifest, index and metadata were fetched (and verified)
    /// into `local_dir`. Its shards are not there: `remote.source` supplies verified
    /// copies, so shard sizes and checksums are checked when each is fetched, not here.
    pub fn openRemote(gpa: std.mem.Allocator, local_dir: []const u8, position: u64, checks: Checks, remote: RemoteOrigin) status.Error!Cache {
        return openWith(gpa, local_dir, position, checks, remote);
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
        if (checks == .structure) {
            // Unvalidated, as the reference: every shard's size, then metadata.arrow's
            // presence.
            if (remote == null) for (m.shards, shard_paths) |shard, p| try checkShardSize(p, shard.byte_len);
            try checkMetadataPresent(dir, path);
        } else {
            // Validated, in the reference's order: metadata.arrow (present, SHA-256),
            // index.bin, then each local shard's size and SHA-256. With `.every_damaged`
            // a damaged file's error is noted and the checks go on.
            var damaged: Damaged = .{ .checks = checks };
            if (checkMetadataPresent(dir, path)) |_| {
                verifyFile(gpa, dir, "metadata.arrow", path, m.metadata_sha256) catch |err| try damaged.note(err);
            } else |err| try damaged.note(err);
            verifyFile(gpa, dir, "index.bin", path, m.index_sha256) catch |err| try damaged.note(err);
            if (remote == null) for (m.shards, shard_paths) |shard, p| {
                checkShardSize(p, shard.byte_len) catch |err| {
                    try damaged.note(err);
                    continue;
                };
                verifySha(p, shard.sha256) catch |err| try damaged.note(err);
            };
            try damaged.check();
        }

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
pub const Checks = enum { structure, first_damaged, every_damaged };

/// The damaged files an `.every_damaged` open found: their errors' messages, one per
/// line, for one error message (`status.message_bytes_max`). Lines past the bound are
/// counted instead, on a last line that replaces the lines it needs room for.
pub const Damaged = struct {
    checks: Checks,
    text: [status.message_bytes_max]u8 = undefined,
    len: usize = 0,
    /// Files noted, and the error of the first (a single damaged file fails as it
    /// would alone).
    count: usize = 0,
    first: status.Error = error.InvalidCache,
    /// Lines in `text`; the length and lines that leave room for the last line.
    lines: usize = 0,
    fit_len: usize = 0,
    fit_lines: usize = 0,

    /// Room for the last line ("\n... and N more damaged files").
    const tail_bytes = 48;

    /// Notes the file whose check failed with `err` (its message is this thread's last
    /// error) when the open names every damaged file; otherwise, or for running out of
    /// memory, returns `err`.
    pub fn note(d: *Damaged, err: status.Error) status.Error!void {
        if (d.checks != .every_damaged or err == error.OutOfMemory) return err;
        if (d.count == 0) d.first = err;
        d.count += 1;
        const line = status.lastMessage(); // at most message_bytes_max bytes
        const sep: usize = @intFromBool(d.len > 0);
        if (d.lines < d.count - 1 or d.len + sep + line.len > d.text.len) return; // counted
        if (sep == 1) d.text[d.len] = '\n';
        @memcpy(d.text[d.len + sep ..][0..line.len], line);
        d.len += sep + line.len;
        d.lines += 1;
        if (d.len + tail_bytes <= d.text.len) {
            d.fit_len = d.len;
            d.fit_lines = d.lines;
        }
    }

    /// Fails when any file was noted: one file with its own error and message, several
    /// with `error.InvalidCache` and a line each.
    pub fn check(d: *const Damaged) status.Error!void {
        if (d.count == 0) return;
        if (d.lines == d.count) return status.fail(if (d.count == 1) d.first else error.InvalidCache, "{s}", .{d.text[0..d.len]});
        if (d.fit_lines > 0) return status.fail(error.InvalidCache, "{s}\n... and {d} more damaged files", .{ d.text[0..d.fit_len], d.count - d.fit_lines });
        // The first line alone leaves no room: its start, cut on a UTF-8 boundary.
        const keep = status.utf8PrefixLen(d.text[0..d.len], d.text.len - tail_bytes - "...".len);
        return status.fail(error.InvalidCache, "{s}...\n... and {d} more damaged files", .{ d.text[0..keep], d.count - 1 });
    }
};

/// Fails with "shard length mismatch for <path>" unless the file at `path` has `len` bytes.
fn checkShardSize(path: [:0]const u8, len: u64) status.Error!void {
    // (fstatat: std's statFile treats a name longer than NAME_MAX as unreachable)
    const st = posix.fstatatZ(posix.AT.FDCWD, path, 0) catch |err| return status.failIo(err, path);
    if (st.size != len) return status.fail(error.InvalidCache, "shard length mismatch for {s}", .{path});
}

/// Fails with an I/O error naming `<cache_path>/metadata.arrow` unless it exists.
fn checkMetadataPresent(dir: std.fs.Dir, cache_path: []const u8) status.Error!void {
    _ = dir.statFile("metadata.arrow") catch |err| {
        return status.fail(error.Io, "I/O error: {s}: {s}/metadata.arrow", .{ status.describeOsError(err), cache_path });
    };
}

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

test "Damaged: lines whole within the message bound, one file as it fails alone, the rest counted" {
    const testing = std.testing;
    var long: [status.message_bytes_max - 10]u8 = undefined;
    @memset(&long, 'x');
    // One file: its own error and message, whole even when near the bound.
    var one: Damaged = .{ .checks = .every_damaged };
    try one.note(status.fail(error.Io, "{s}", .{&long}));
    try testing.expectError(error.Io, one.check());
    try testing.expectEqualStrings(&long, status.lastMessage());
    // Several short ones: a line each, in order.
    var few: Damaged = .{ .checks = .every_damaged };
    try few.note(status.fail(error.InvalidCache, "a", .{}));
    try few.note(status.fail(error.Io, "b", .{}));
    try testing.expectError(error.InvalidCache, few.check());
    try testing.expectEqualStrings("a\nb", status.lastMessage());
    // Many: whole lines, then the count of the others.
    var many: Damaged = .{ .checks = .every_damaged };
    for (0..500) |i| try many.note(status.fail(error.InvalidCache, "checksum mismatch for file {d}", .{i}));
    try testing.expectError(error.InvalidCache, many.check());
    const msg = status.lastMessage();
    try testing.expect(msg.len <= status.message_bytes_max);
    const last = msg[std.mem.lastIndexOfScalar(u8, msg, '\n').? + 1 ..];
    const named = std.mem.count(u8, msg, "\n");
    var buf: [64]u8 = undefined;
    try testing.expectEqualStrings(try std.fmt.bufPrint(&buf, "... and {d} more damaged files", .{500 - named}), last);
    try testing.expect(std.mem.startsWith(u8, msg, "checksum mismatch for file 0\nchecksum mismatch for file 1\n"));
    // A first line that leaves no room for the count: cut (marked) on a UTF-8 boundary.
    var wide: [status.message_bytes_max / 2 - 1]u16 = undefined;
    @memset(&wide, 0xA9C3); // "é" (C3 A9) repeated
    var cut: Damaged = .{ .checks = .every_damaged };
    try cut.note(status.fail(error.InvalidCache, "{s}", .{std.mem.sliceAsBytes(&wide)}));
    try cut.note(status.fail(error.InvalidCache, "second", .{}));
    try testing.expectError(error.InvalidCache, cut.check());
    const cut_msg = status.lastMessage();
    try testing.expect(std.unicode.utf8ValidateSlice(cut_msg));
    try testing.expect(std.mem.endsWith(u8, cut_msg, "...\n... and 1 more damaged files"));
    // Not naming every file: the first error is returned as it is.
    var first: Damaged = .{ .checks = .first_damaged };
    try testing.expectError(error.Io, first.note(status.fail(error.Io, "x", .{})));
}
