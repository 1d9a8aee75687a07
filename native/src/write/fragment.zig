//! Committing fragments into one cache. A *fragment* is a complete cache written by the
//! ordinary writer (writer.zig) under a directory of the caller's choice, one per task of
//! a distributed job; its manifest carries the checksums of its files. A *commit* turns
//! an ordered list of fragments into one published cache `<base>/<name>`:
//!
//! - Sample ids follow the list: fragment 0's samples first, in their order, then
//!   fragment 1's, and so on.
//! - Shard files are reused unchanged (records carry no sample id): each is hard-linked
//!   into the staging directory under its new number (copied when the file system cannot
//!   link, e.g. across devices), then hashed and compared with its fragment's manifest,
//!   so the new manifest only states checksums that were verified on the final files.
//! - `index.bin` is the concatenation of the fragments' index files with shard ids
//!   offset, each fragment's index checked against its checksum and every row against
//!   its shard's size while it is copied.
//! - `metadata.arrow` is written by the caller into the staging directory (the Python
//!   layer concatenates the fragments' files with pyarrow) after each fragment's file was
//!   verified here (its checksum, and one row per sample of the fragment); `finish` checks its row count, field names and types (the exact
//!   Arrow types a reader accepts, no nulls) before it is hashed.
//! - Publication is the writer's (store/publish.zig): staging under `<base>/tmp/` held
//!   under an exclusive flock, fsync of every file and directory, manifest last,
//!   renameat2(RENAME_NOREPLACE) (or RENAME_EXCHANGE with `replace`), fsync of `<base>`.
//!
//! Invariants: nothing appears at `<base>/<name>` unless `finish` succeeds; a commit
//! closed without finishing removes its staging directory; fragments are only read,
//! never modified or removed, so a failed commit can be retried on the same fragments.

const std = @import("std");
const posix = std.posix;
const status = @import("../base/status.zig");
const manifest = @import("../format/manifest.zig");
const index = @import("../format/index.zig");
const schema = @import("../format/schema.zig");
const arrow = @import("../format/arrow.zig");
const shard = @import("../format/shard.zig");
const publish = @import("../store/publish.zig");
const Sha256 = @import("../codec/sha256.zig").Sha256;
const runtime = @import("../base/runtime.zig");

pub const Options = struct {
    /// Publish by atomically exchanging with an existing cache at the destination (the
    /// writer's DRT_WRITER_REPLACE semantics) instead of refusing it.
    replace: bool = false,
};

/// Largest fragment manifest read (the same bound as a cache's manifest).
const manifest_bytes_max = 64 << 20;
/// Index rows copied per read.
const index_rows_per_read = 4096;

pub const Commit = struct {
    gpa: std.mem.Allocator,
    pid: posix.pid_t,
    options: Options,
    name: []u8,
    staging: publish.Staging,
    index_file: publish.HashedFile,
    index_open: bool = true,
    /// The schema, compression and path of the first fragment (in `arena`): every other
    /// fragment must agree with it.
    arena: std.heap.ArenaAllocator,
    fields: []schema.Field = &.{},
    compression: manifest.Compression = .none,
    ratio: f64 = 1.0,
    first_fragment: []const u8 = "",
    shards: std.ArrayList(manifest.WriteShard) = .empty,
    sample_count: u64 = 0,
    fragment_count: u64 = 0,
    failed: bool = false,

    /// Verifies `fragments` (paths of fragment directories, in sample order), creates the
    /// staging directory for `<base>/<name>`, links their shards into it and writes the
    /// merged `index.bin`. On error nothing is left on disk.
    pub fn open(gpa: std.mem.Allocator, base: []const u8, name: []const u8, fragments: []const []const u8, options: Options) status.Error!*Commit {
        try publish.checkName(name);
        try publish.checkBase(base);
        if (fragments.len == 0) return status.fail(error.InvalidArgument, "no fragments to commit", .{});
        for (fragments) |path| {
            if (path.len == 0 or std.mem.indexOfScalar(u8, path, 0) != null) return status.fail(error.InvalidArgument, "invalid fragment path", .{});
        }
        const c = try create(gpa, base, name, options);
        // From here on `close` owns everything, including the staging directory.
        errdefer c.close();
        for (fragments) |path| try c.addFragment(path);
        return c;
    }

    /// The commit with its staging directory and an empty index.bin.
    fn create(gpa: std.mem.Allocator, base: []const u8, name: []const u8, options: Options) status.Error!*Commit {
        const name_copy = try gpa.dupe(u8, name);
        errdefer gpa.free(name_copy);
        var staging = try publish.Staging.create(gpa, base, name, options.replace);
        errdefer staging.discard(gpa);
        const index_file = staging.dir.createFile("index.bin", .{ .exclusive = true }) catch |err| return status.failIo(err, staging.staging_path);
        errdefer index_file.close();
        const c = try gpa.create(Commit);
        c.* = .{
            .gpa = gpa,
            .pid = runtime.currentPid(),
            .options = options,
            .name = name_copy,
            .staging = staging,
            .index_file = .{ .file = index_file, .hasher = .init() },
            .arena = .init(gpa),
        };
        return c;
    }

    /// Appends one fragment: checks it against the first, verifies metadata.arrow, places
    /// and verifies its shards, and copies its index rows with shard ids offset.
    fn addFragment(c: *Commit, path: []const u8) status.Error!void {
        const gpa = c.gpa;
        const manifest_path = try std.fmt.allocPrint(gpa, "{s}/manifest.json", .{path});
        defer gpa.free(manifest_path);
        const text = std.fs.cwd().readFileAlloc(gpa, manifest_path, manifest_bytes_max) catch |err| switch (err) {
            error.FileNotFound, error.NotDir => return status.fail(error.InvalidCache, "missing fragment manifest: {s}", .{manifest_path}),
            error.OutOfMemory => return error.OutOfMemory,
            error.FileTooBig => return status.fail(error.InvalidCache, "manifest is too large: {s}", .{manifest_path}),
            else => return status.failIo(err, manifest_path),
        };
        defer gpa.free(text);
        var m = try manifest.parse(gpa, text, manifest_path);
        defer m.deinit();
        if (m.shards.len == 0 or m.sample_count == 0) return status.fail(error.InvalidCache, "fragment has no samples: {s}", .{path});

        if (c.fragment_count == 0) {
            const a = c.arena.allocator();
            c.first_fragment = try a.dupe(u8, path);
            const fields = try a.alloc(schema.Field, m.fields.len);
            for (m.fields, fields) |from, *to| to.* = .{ .name = try a.dupe(u8, from.name), .kind = from.kind };
            c.fields = fields;
            c.compression = m.shards[0].compression;
            c.ratio = m.shards[0].ratio;
        } else if (!sameFields(c.fields, m.fields)) {
            return status.fail(error.InvalidArgument, "fragment {s} has a different metadata schema than fragment {s}", .{ path, c.first_fragment });
        }
        for (m.shards) |s| {
            if (s.compression != c.compression or s.ratio != c.ratio) {
                return status.fail(error.InvalidArgument, "fragment {s} has a different shard compression than fragment {s}", .{ path, c.first_fragment });
            }
        }

        const metadata_path = try std.fmt.allocPrintSentinel(gpa, "{s}/metadata.arrow", .{path}, 0);
        defer gpa.free(metadata_path);
        try publish.verifyDigest((try publish.hashPath(metadata_path)).sha256, m.metadata_sha256, metadata_path);
        // Rows must match samples fragment by fragment (the merged total could add up
        // while rows sit next to other fragments' samples).
        const rows = try metadataRows(gpa, metadata_path);
        if (rows != m.sample_count) {
            return status.fail(error.InvalidCache, "metadata row count does not match manifest: {s} has {d} rows, {d} samples", .{ metadata_path, rows, m.sample_count });
        }

        // Shards first: the index rows are checked against their verified sizes.
        const shard_base: u64 = c.shards.items.len;
        var shards_dir = c.staging.dir.openDir("shards", .{}) catch |err| return status.failIo(err, c.staging.staging_path);
        defer shards_dir.close();
        for (m.shards) |s| {
            const src = try std.fmt.allocPrintSentinel(gpa, "{s}/shards/{s}", .{ path, s.name }, 0);
            defer gpa.free(src);
            var name_buf: [32]u8 = undefined;
            const dst = manifest.shardName(&name_buf, c.shards.items.len);
            const placed = try placeShard(src, shards_dir, dst);
            if (placed.byte_len != s.byte_len) return status.fail(error.InvalidCache, "shard length mismatch for {s}", .{src});
            try publish.verifyDigest(placed.sha256, s.sha256, src);
            try c.shards.append(gpa, .{ .uncompressed_byte_len = s.uncompressed_byte_len, .byte_len = s.byte_len, .sha256 = placed.sha256 });
        }
        try c.copyIndex(path, &m, shard_base);
        c.sample_count = std.math.add(u64, c.sample_count, m.sample_count) catch
            return status.fail(error.Overflow, "the fragments hold more than 2^64 samples", .{});
        c.fragment_count += 1;
    }

    /// Streams `<path>/index.bin` into the staging index with shard ids offset by
    /// `shard_base`, checking its size, checksum, and every row against its shard.
    fn copyIndex(c: *Commit, path: []const u8, m: *const manifest.Manifest, shard_base: u64) status.Error!void {
        const gpa = c.gpa;
        const index_path = try std.fmt.allocPrint(gpa, "{s}/index.bin", .{path});
        defer gpa.free(index_path);
        const file = std.fs.cwd().openFile(index_path, .{}) catch |err| return status.failIo(err, index_path);
        defer file.close();
        const size = (file.stat() catch |err| return status.failIo(err, index_path)).size;
        if (size % index.row_bytes != 0) return status.fail(error.InvalidCache, "index length is not divisible by row size: {s}", .{index_path});
        if (size / index.row_bytes != m.sample_count) return status.fail(error.InvalidCache, "index row count does not match manifest: {s}", .{index_path});
        var hasher: Sha256 = .init();
        var buf: [index_rows_per_read * index.row_bytes]u8 = undefined;
        var row_number: u64 = 0;
        // The first bad row is reported after the checksum: a damaged file gets "checksum
        // mismatch", a well-hashed file with a bad row (a buggy producer) names the row.
        var bad_row: ?u64 = null;
        var remaining: u64 = size;
        while (remaining > 0) {
            const want: usize = @intCast(@min(remaining, buf.len));
            const n = file.readAll(buf[0..want]) catch |err| return status.failIo(err, index_path);
            if (n != want) return status.fail(error.InvalidCache, "index changed while it was read: {s}", .{index_path});
            hasher.update(buf[0..n]);
            remaining -= n;
            var at: usize = 0;
            while (at < n) : (at += index.row_bytes) {
                const row = index.get(buf[at..][0..index.row_bytes], 0);
                const shard_len = if (row.shard_id < m.shards.len) m.shards[@intCast(row.shard_id)].byte_len else 0;
                if (row.byte_len < shard.header_bytes or row.offset > shard_len or row.byte_len > shard_len - row.offset) {
                    if (bad_row == null) bad_row = row_number;
                }
                row_number += 1;
                if (bad_row != null) continue;
                const moved = index.encode(.{ .shard_id = row.shard_id + shard_base, .offset = row.offset, .byte_len = row.byte_len });
                try c.index_file.append(gpa, &moved, c.staging.staging_path);
            }
        }
        try publish.verifyDigest(hasher.finalResult(), m.index_sha256, index_path);
        if (bad_row) |row| return status.fail(error.InvalidCache, "index row {d} lies outside its shards: {s}", .{ row, index_path });
    }

    /// Checks the caller's metadata.arrow, then writes the manifest and publishes (see
    /// drt_commit_finish).
    /// error.Forked in a process other than the one that opened the commit.
    pub fn checkPid(c: *const Commit) status.Error!void {
        if (c.pid != runtime.currentPid()) return runtime.forkedError();
    }

    pub fn finish(c: *Commit) status.Error!void {
        try c.checkPid();
        if (c.failed or c.staging.published) return status.fail(error.InvalidArgument, "the commit cannot finish after a failure or finish", .{});
        errdefer c.failed = true;
        const staging_path = c.staging.staging_path;
        const index_sha = try c.index_file.finish(staging_path);
        c.index_open = false;
        const metadata_sha = try c.staging.checkMetadata(c.gpa, c.fields, c.sample_count);

        var text: std.ArrayList(u8) = .empty;
        defer text.deinit(c.gpa);
        try manifest.write(c.gpa, &text, .{
            .source_name = c.name,
            .sample_count = c.sample_count,
            .fields = c.fields,
            .metadata_sha256 = metadata_sha,
            .index_sha256 = index_sha,
            .shards = c.shards.items,
            .compression = c.compression,
            .ratio = c.ratio,
        });
        // Linked shards were fsynced by their fragment's writer (copies by placeShard);
        // their new names live in shards/, which publishing fsyncs.
        try c.staging.publish(text.items, c.options.replace);
    }

    /// The row count of the Arrow IPC file at `path` (its footer's record batches).
    fn metadataRows(gpa: std.mem.Allocator, path: [:0]const u8) status.Error!u64 {
        const file = std.fs.cwd().openFileZ(path, .{}) catch |err| return status.failIo(err, path);
        defer file.close();
        const size = (file.stat() catch |err| return status.failIo(err, path)).size;
        if (size == 0) return status.fail(error.InvalidCache, "invalid metadata Arrow footer: {s}", .{path});
        const map = posix.mmap(null, @intCast(size), posix.PROT.READ, .{ .TYPE = .PRIVATE }, file.handle, 0) catch |err| return status.failIo(err, path);
        defer posix.munmap(map);
        var parsed = try arrow.File.parse(gpa, map);
        defer parsed.deinit(gpa);
        return parsed.row_count;
    }

    /// Releases everything; removes the staging directory unless the cache was published.
    pub fn close(c: *Commit) void {
        const gpa = c.gpa;
        const forked = c.pid != runtime.currentPid();
        c.index_file.deinit(gpa, c.index_open);
        c.staging.close(gpa, forked);
        c.shards.deinit(gpa);
        c.arena.deinit();
        gpa.free(c.name);
        gpa.destroy(c);
    }

    pub fn stagingPath(c: *const Commit) []const u8 {
        return c.staging.staging_path;
    }
};

fn sameFields(a: []const schema.Field, b: []const schema.Field) bool {
    if (a.len != b.len) return false;
    for (a, b) |x, y| {
        if (x.kind != y.kind or !std.mem.eql(u8, x.name, y.name)) return false;
    }
    return true;
}

/// Makes `src` the file `dst_name` in `dir`: a hard link, or a copy (fsynced) where the
/// file system refuses links. Returns the size and SHA-256 of what was placed.
fn placeShard(src: [:0]const u8, dir: std.fs.Dir, dst_name: []const u8) status.Error!publish.Digest {
    var name_z: [32:0]u8 = undefined;
    @memcpy(name_z[0..dst_name.len], dst_name);
    name_z[dst_name.len] = 0;
    const dst = name_z[0..dst_name.len :0];
    posix.linkatZ(posix.AT.FDCWD, src, dir.fd, dst, 0) catch |err| switch (err) {
        // Another device (fragments on a different mount), or a file system without
        // hard links: copy instead.
        error.NotSameFileSystem, error.PermissionDenied, error.LinkQuotaExceeded => return publish.copyFile(src, dir, dst),
        else => return status.failIo(err, src),
    };
    const file = dir.openFileZ(dst, .{}) catch |err| return status.failIo(err, src);
    defer file.close();
    return publish.hashFile(file, src);
}

// ---------------------------------------------------------------------------- tests

const testing = std.testing;

/// pyarrow IPC files with one non-null int64 column "i" = 0..n-1 (n = 5 and n = 4).
const arrow_i5 = "QVJST1cxAAD/////eAAAABAAAAAAAAoADAAGAAUACAAKAAAAAAEEAAwAAAAIAAgAAAAEAAgAAAAEAAAAAQAAABQAAAAQABQACAAAAAcADAAAABAAEAAAAAAAAAIQAAAAHAAAAAQAAAAAAAAAAQAAAGkAAAAIAAwACAAHAAgAAAAAAAABQAAAAP////+IAAAAFAAAAAAAAAAMABYABgAFAAgADAAMAAAAAAMEABgAAAAoAAAAAAAAAAAACgAYAAwABAAIAAoAAAA8AAAAEAAAAAUAAAAAAAAAAAAAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAoAAAAAAAAAAAAAAABAAAABQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAQAAAAAAAAACAAAAAAAAAAMAAAAAAAAABAAAAAAAAAD/////AAAAABAAAAAMABQABgAIAAwAEAAMAAAAAAAEADQAAAAkAAAABAAAAAEAAACIAAAAAAAAAJAAAAAAAAAAKAAAAAAAAAAAAAAACAAIAAAABAAIAAAABAAAAAEAAAAUAAAAEAAUAAgAAAAHAAwAAAAQABAAAAAAAAACEAAAABwAAAAEAAAAAAAAAAEAAABpAAAACAAMAAgABwAIAAAAAAAAAUAAAACgAAAAQVJST1cx";
/// Fragment metadata: `i` = 0, 1 and `i` = 2, 3, 4.
const arrow_i01 = "QVJST1cxAAD/////eAAAABAAAAAAAAoADAAGAAUACAAKAAAAAAEEAAwAAAAIAAgAAAAEAAgAAAAEAAAAAQAAABQAAAAQABQACAAAAAcADAAAABAAEAAAAAAAAAIQAAAAHAAAAAQAAAAAAAAAAQAAAGkAAAAIAAwACAAHAAgAAAAAAAABQAAAAP////+IAAAAFAAAAAAAAAAMABYABgAFAAgADAAMAAAAAAMEABgAAAAQAAAAAAAAAAAACgAYAAwABAAIAAoAAAA8AAAAEAAAAAIAAAAAAAAAAAAAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAQAAAAAAAAAAAAAAABAAAAAgAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAQAAAAAAAAD/////AAAAABAAAAAMABQABgAIAAwAEAAMAAAAAAAEADQAAAAkAAAABAAAAAEAAACIAAAAAAAAAJAAAAAAAAAAEAAAAAAAAAAAAAAACAAIAAAABAAIAAAABAAAAAEAAAAUAAAAEAAUAAgAAAAHAAwAAAAQABAAAAAAAAACEAAAABwAAAAEAAAAAAAAAAEAAABpAAAACAAMAAgABwAIAAAAAAAAAUAAAACgAAAAQVJST1cx";
const arrow_i234 = "QVJST1cxAAD/////eAAAABAAAAAAAAoADAAGAAUACAAKAAAAAAEEAAwAAAAIAAgAAAAEAAgAAAAEAAAAAQAAABQAAAAQABQACAAAAAcADAAAABAAEAAAAAAAAAIQAAAAHAAAAAQAAAAAAAAAAQAAAGkAAAAIAAwACAAHAAgAAAAAAAABQAAAAP////+IAAAAFAAAAAAAAAAMABYABgAFAAgADAAMAAAAAAMEABgAAAAYAAAAAAAAAAAACgAYAAwABAAIAAoAAAA8AAAAEAAAAAMAAAAAAAAAAAAAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAYAAAAAAAAAAAAAAABAAAAAwAAAAAAAAAAAAAAAAAAAAIAAAAAAAAAAwAAAAAAAAAEAAAAAAAAAP////8AAAAAEAAAAAwAFAAGAAgADAAQAAwAAAAAAAQANAAAACQAAAAEAAAAAQAAAIgAAAAAAAAAkAAAAAAAAAAYAAAAAAAAAAAAAAAIAAgAAAAEAAgAAAAEAAAAAQAAABQAAAAQABQACAAAAAcADAAAABAAEAAAAAAAAAIQAAAAHAAAAAQAAAAAAAAAAQAAAGkAAAAIAAwACAAHAAgAAAAAAAABQAAAAKAAAABBUlJPVzE=";
const arrow_i4 = "QVJST1cxAAD/////eAAAABAAAAAAAAoADAAGAAUACAAKAAAAAAEEAAwAAAAIAAgAAAAEAAgAAAAEAAAAAQAAABQAAAAQABQACAAAAAcADAAAABAAEAAAAAAAAAIQAAAAHAAAAAQAAAAAAAAAAQAAAGkAAAAIAAwACAAHAAgAAAAAAAABQAAAAP////+IAAAAFAAAAAAAAAAMABYABgAFAAgADAAMAAAAAAMEABgAAAAgAAAAAAAAAAAACgAYAAwABAAIAAoAAAA8AAAAEAAAAAQAAAAAAAAAAAAAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAgAAAAAAAAAAAAAAABAAAABAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAQAAAAAAAAACAAAAAAAAAAMAAAAAAAAA/////wAAAAAQAAAADAAUAAYACAAMABAADAAAAAAABAA0AAAAJAAAAAQAAAABAAAAiAAAAAAAAACQAAAAAAAAACAAAAAAAAAAAAAAAAgACAAAAAQACAAAAAQAAAABAAAAFAAAABAAFAAIAAAABwAMAAAAEAAQAAAAAAAAAhAAAAAcAAAABAAAAAAAAAABAAAAaQAAAAgADAAIAAcACAAAAAAAAAFAAAAAoAAAAEFSUk9XMQ==";

fn writeBase64(dir: std.fs.Dir, name: []const u8, comptime text: []const u8) !void {
    const decoder = std.base64.standard.Decoder;
    var out: [try decoder.calcSizeForSlice(text)]u8 = undefined;
    try decoder.decode(&out, text);
    try dir.writeFile(.{ .sub_path = name, .data = &out });
}

fn sha(bytes: []const u8) [32]u8 {
    var h: Sha256 = .init();
    h.update(bytes);
    return h.finalResult();
}

/// Builds a fragment directory `name` by hand, as the writer would: samples first..last-1
/// with metadata {"i": k} and payload "p<k>", `per_shard` records per shard; metadata.arrow
/// holds the rows of `i` (2 or 3 of them: the fixture's fragments).
fn buildFragment(dir: std.fs.Dir, name: []const u8, first: u64, last: u64, per_shard: u64) !void {
    const gpa = testing.allocator;
    var frag = try dir.makeOpenPath(name, .{});
    defer frag.close();
    try frag.makePath("shards");
    var shards: std.ArrayList(manifest.WriteShard) = .empty;
    defer shards.deinit(gpa);
    var idx: std.ArrayList(u8) = .empty;
    defer idx.deinit(gpa);
    var bytes: std.ArrayList(u8) = .empty;
    defer bytes.deinit(gpa);
    var raw: u64 = 0;
    var k = first;
    while (k < last) : (k += 1) {
        var json_buf: [32]u8 = undefined;
        const json = try std.fmt.bufPrint(&json_buf, "{{\"i\":{d}}}", .{k});
        var payload_buf: [32]u8 = undefined;
        const payload = try std.fmt.bufPrint(&payload_buf, "p{d}", .{k});
        const offset = bytes.items.len;
        var len_bytes: [8]u8 = undefined;
        std.mem.writeInt(u64, &len_bytes, json.len, .little);
        try bytes.appendSlice(gpa, &len_bytes);
        try bytes.appendSlice(gpa, json);
        try bytes.appendSlice(gpa, payload);
        raw += payload.len;
        try idx.appendSlice(gpa, &index.encode(.{ .shard_id = shards.items.len, .offset = offset, .byte_len = bytes.items.len - offset }));
        if ((k - first + 1) % per_shard == 0 or k + 1 == last) {
            var name_buf: [32]u8 = undefined;
            var shards_dir = try frag.openDir("shards", .{});
            defer shards_dir.close();
            try shards_dir.writeFile(.{ .sub_path = manifest.shardName(&name_buf, shards.items.len), .data = bytes.items });
            try shards.append(gpa, .{ .uncompressed_byte_len = raw, .byte_len = bytes.items.len, .sha256 = sha(bytes.items) });
            bytes.clearRetainingCapacity();
            raw = 0;
        }
    }
    try frag.writeFile(.{ .sub_path = "index.bin", .data = idx.items });
    switch (last - first) {
        2 => try writeBase64(frag, "metadata.arrow", arrow_i01),
        3 => try writeBase64(frag, "metadata.arrow", arrow_i234),
        else => return error.TestUnexpectedResult,
    }
    const metadata = try frag.readFileAlloc(gpa, "metadata.arrow", 1 << 20);
    defer gpa.free(metadata);
    var text: std.ArrayList(u8) = .empty;
    defer text.deinit(gpa);
    const fields = [_]schema.Field{.{ .name = "i", .kind = .int }};
    try manifest.write(gpa, &text, .{
        .source_name = name,
        .sample_count = last - first,
        .fields = &fields,
        .metadata_sha256 = sha(metadata),
        .index_sha256 = sha(idx.items),
        .shards = shards.items,
        .compression = .none,
        .ratio = 1.0,
    });
    try frag.writeFile(.{ .sub_path = "manifest.json", .data = text.items });
}

const Fixture = struct {
    tmp: std.testing.TmpDir,
    root: []u8,
    base: []u8,
    frag_paths: [2][]u8,

    /// Fragments f0 (samples 0, 1 in one shard) and f1 (samples 2, 3, 4: two shards).
    fn init() !Fixture {
        const gpa = testing.allocator;
        var tmp = testing.tmpDir(.{});
        errdefer tmp.cleanup();
        try buildFragment(tmp.dir, "f0", 0, 2, 8);
        try buildFragment(tmp.dir, "f1", 2, 5, 2);
        const root = try tmp.dir.realpathAlloc(gpa, ".");
        errdefer gpa.free(root);
        return .{
            .tmp = tmp,
            .root = root,
            .base = try std.fmt.allocPrint(gpa, "{s}/base", .{root}),
            .frag_paths = .{ try std.fmt.allocPrint(gpa, "{s}/f0", .{root}), try std.fmt.allocPrint(gpa, "{s}/f1", .{root}) },
        };
    }

    fn deinit(f: *Fixture) void {
        const gpa = testing.allocator;
        for (f.frag_paths) |p| gpa.free(p);
        gpa.free(f.base);
        gpa.free(f.root);
        f.tmp.cleanup();
    }

    fn paths(f: *const Fixture) [2][]const u8 {
        return .{ f.frag_paths[0], f.frag_paths[1] };
    }

    /// Entries left in `<base>/tmp` (staging directories).
    fn stagingLeft(f: *Fixture) !usize {
        var tmp_dir = try f.tmp.dir.openDir("base/tmp", .{ .iterate = true });
        defer tmp_dir.close();
        var it = tmp_dir.iterate();
        var n: usize = 0;
        while (try it.next()) |_| n += 1;
        return n;
    }

    fn exists(f: *Fixture, sub: []const u8) bool {
        f.tmp.dir.access(sub, .{}) catch return false;
        return true;
    }
};

fn commitAll(f: *Fixture, order: []const []const u8, metadata: ?[]const u8, options: Options) !void {
    const c = try Commit.open(testing.allocator, f.base, "out", order, options);
    defer c.close();
    if (metadata) |text| {
        var staging = try std.fs.cwd().openDir(c.stagingPath(), .{});
        defer staging.close();
        if (std.mem.eql(u8, text, "i5")) try writeBase64(staging, "metadata.arrow", arrow_i5) else try writeBase64(staging, "metadata.arrow", arrow_i4);
    }
    try c.finish();
}

test "commit merges fragments in order: shards renumbered and unchanged, index offset, manifest" {
    const gpa = testing.allocator;
    var f = try Fixture.init();
    defer f.deinit();
    const paths = f.paths();
    try commitAll(&f, &paths, "i5", .{});

    const m_text = try f.tmp.dir.readFileAlloc(gpa, "base/out/manifest.json", 1 << 20);
    defer gpa.free(m_text);
    var m = try manifest.parse(gpa, m_text, "manifest.json");
    defer m.deinit();
    try testing.expectEqual(@as(u64, 5), m.sample_count);
    try testing.expectEqualStrings("out", m.source_name);
    try testing.expectEqual(manifest.cacheIdForName("out"), m.cache_id.?);
    try testing.expectEqual(@as(usize, 3), m.shards.len);
    // Shard k of the cache is byte for byte the k-th shard of the fragments in order.
    const sources = [_][]const u8{ "f0/shards/000000.bin", "f1/shards/000000.bin", "f1/shards/000001.bin" };
    for (sources, m.shards) |src, s| {
        const want = try f.tmp.dir.readFileAlloc(gpa, src, 1 << 20);
        defer gpa.free(want);
        const path = try std.fmt.allocPrint(gpa, "base/out/shards/{s}", .{s.name});
        defer gpa.free(path);
        const got = try f.tmp.dir.readFileAlloc(gpa, path, 1 << 20);
        defer gpa.free(got);
        try testing.expectEqualSlices(u8, want, got);
        try testing.expectEqualStrings(&std.fmt.bytesToHex(sha(got), .lower), s.sha256);
    }
    // Index rows: sample k names its record in the renumbered shard.
    const idx = try f.tmp.dir.readFileAlloc(gpa, "base/out/index.bin", 1 << 20);
    defer gpa.free(idx);
    try testing.expectEqualStrings(&std.fmt.bytesToHex(sha(idx), .lower), m.index_sha256);
    const expected_shard = [_]u64{ 0, 0, 1, 1, 2 };
    for (expected_shard, 0..) |want_shard, k| {
        const row = index.get(idx, k);
        try testing.expectEqual(want_shard, row.shard_id);
        const shard_bytes = try f.tmp.dir.readFileAlloc(gpa, sources[@intCast(want_shard)], 1 << 20);
        defer gpa.free(shard_bytes);
        const rec = try shard.split(shard_bytes[@intCast(row.offset)..][0..@intCast(row.byte_len)]);
        var buf: [32]u8 = undefined;
        try testing.expectEqualStrings(try std.fmt.bufPrint(&buf, "p{d}", .{k}), rec.stored_payload);
    }
    // Staging is gone; the fragments are untouched.
    try testing.expectEqual(@as(usize, 0), try f.stagingLeft());
    try testing.expect(f.exists("f0/shards/000000.bin") and f.exists("f1/manifest.json"));
}

test "a corrupt shard, index or metadata file is rejected naming it, and nothing is published" {
    const gpa = testing.allocator;
    const cases = [_]struct { file: []const u8, message: []const u8 }{
        .{ .file = "f1/shards/000001.bin", .message = "checksum mismatch for " },
        .{ .file = "f1/index.bin", .message = "checksum mismatch for " },
        .{ .file = "f0/metadata.arrow", .message = "checksum mismatch for " },
    };
    for (cases) |case| {
        var f = try Fixture.init();
        defer f.deinit();
        const bytes = try f.tmp.dir.readFileAlloc(gpa, case.file, 1 << 20);
        defer gpa.free(bytes);
        bytes[bytes.len - 1] ^= 1;
        try f.tmp.dir.writeFile(.{ .sub_path = case.file, .data = bytes });
        const paths = f.paths();
        try testing.expectError(error.InvalidCache, commitAll(&f, &paths, "i5", .{}));
        const msg = status.lastMessage();
        try testing.expect(std.mem.startsWith(u8, msg, case.message));
        try testing.expect(std.mem.endsWith(u8, msg, case.file));
        try testing.expect(!f.exists("base/out"));
        try testing.expectEqual(@as(usize, 0), try f.stagingLeft());
    }
}

test "a missing fragment, a truncated shard and an index row outside its shard are rejected" {
    const gpa = testing.allocator;
    {
        var f = try Fixture.init();
        defer f.deinit();
        try f.tmp.dir.deleteTree("f1");
        const paths = f.paths();
        try testing.expectError(error.InvalidCache, commitAll(&f, &paths, "i5", .{}));
        try testing.expect(std.mem.startsWith(u8, status.lastMessage(), "missing fragment manifest: "));
        try testing.expect(std.mem.endsWith(u8, status.lastMessage(), "f1/manifest.json"));
        try testing.expect(!f.exists("base/out"));
        try testing.expectEqual(@as(usize, 0), try f.stagingLeft());
    }
    {
        var f = try Fixture.init();
        defer f.deinit();
        try f.tmp.dir.writeFile(.{ .sub_path = "f0/shards/000000.bin", .data = "short" });
        const paths = f.paths();
        try testing.expectError(error.InvalidCache, commitAll(&f, &paths, "i5", .{}));
        try testing.expect(std.mem.startsWith(u8, status.lastMessage(), "shard length mismatch for "));
    }
    {
        // A row whose record reaches past its shard (with a matching checksum: a buggy
        // producer, not bit rot) must not become part of a cache.
        var f = try Fixture.init();
        defer f.deinit();
        const idx = try f.tmp.dir.readFileAlloc(gpa, "f0/index.bin", 1 << 20);
        defer gpa.free(idx);
        std.mem.writeInt(u64, idx[24 + 16 ..][0..8], 1000, .little);
        try f.tmp.dir.writeFile(.{ .sub_path = "f0/index.bin", .data = idx });
        const m_text = try f.tmp.dir.readFileAlloc(gpa, "f0/manifest.json", 1 << 20);
        defer gpa.free(m_text);
        var m = try manifest.parse(gpa, m_text, "m");
        defer m.deinit();
        const fixed = try std.mem.replaceOwned(u8, gpa, m_text, m.index_sha256, &std.fmt.bytesToHex(sha(idx), .lower));
        defer gpa.free(fixed);
        try f.tmp.dir.writeFile(.{ .sub_path = "f0/manifest.json", .data = fixed });
        const paths = f.paths();
        try testing.expectError(error.InvalidCache, commitAll(&f, &paths, "i5", .{}));
        try testing.expect(std.mem.startsWith(u8, status.lastMessage(), "index row 1 lies outside its shards: "));
        try testing.expectEqual(@as(usize, 0), try f.stagingLeft());
    }
}

test "metadata.arrow must match the fragments; an existing cache is refused unless replace" {
    var f = try Fixture.init();
    defer f.deinit();
    const paths = f.paths();
    // Four rows for five samples.
    try testing.expectError(error.InvalidArgument, commitAll(&f, &paths, "i4", .{}));
    try testing.expect(std.mem.startsWith(u8, status.lastMessage(), "metadata.arrow has 4 rows, the cache 5 samples"));
    try testing.expect(!f.exists("base/out"));
    try testing.expectEqual(@as(usize, 0), try f.stagingLeft());
    // No metadata.arrow at all.
    try testing.expectError(error.Io, commitAll(&f, &paths, null, .{}));
    try testing.expect(!f.exists("base/out"));

    try commitAll(&f, &paths, "i5", .{});
    try testing.expectError(error.Exists, commitAll(&f, &paths, "i5", .{}));
    try testing.expect(std.mem.startsWith(u8, status.lastMessage(), "cache path already exists: "));
    // Replace: the fragments in the other order, swapped in atomically.
    const reversed = [_][]const u8{ paths[1], paths[0] };
    try commitAll(&f, &reversed, "i5", .{ .replace = true });
    const gpa = testing.allocator;
    const idx = try f.tmp.dir.readFileAlloc(gpa, "base/out/index.bin", 1 << 20);
    defer gpa.free(idx);
    try testing.expectEqual(@as(u64, 2), index.get(idx, 3).shard_id); // f0's shard is now the third
    try testing.expectEqual(@as(usize, 0), try f.stagingLeft());
}

test "fragments must agree on the schema; an empty list and bad names are refused" {
    var f = try Fixture.init();
    defer f.deinit();
    const gpa = testing.allocator;
    const m_text = try f.tmp.dir.readFileAlloc(gpa, "f1/manifest.json", 1 << 20);
    defer gpa.free(m_text);
    const changed = try std.mem.replaceOwned(u8, gpa, m_text, "\"kind\": \"int\"", "\"kind\": \"float\"");
    defer gpa.free(changed);
    try f.tmp.dir.writeFile(.{ .sub_path = "f1/manifest.json", .data = changed });
    const paths = f.paths();
    try testing.expectError(error.InvalidArgument, commitAll(&f, &paths, "i5", .{}));
    try testing.expect(std.mem.indexOf(u8, status.lastMessage(), "has a different metadata schema than fragment") != null);
    try testing.expectEqual(@as(usize, 0), try f.stagingLeft());

    try testing.expectError(error.InvalidArgument, Commit.open(gpa, f.base, "out", &.{}, .{}));
    try testing.expectEqualStrings("no fragments to commit", status.lastMessage());
    try testing.expectError(error.InvalidArgument, Commit.open(gpa, f.base, "tmp", &paths, .{}));
    try testing.expectError(error.InvalidArgument, Commit.open(gpa, f.base, "a/b", &paths, .{}));
}
