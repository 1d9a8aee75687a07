//! The exported C ABI (dataset_rt.h). Each function is a thin wrapper: check the
//! arguments, call the Zig implementation, and map its error to a status code with
//! `status.toStatus` (an exhaustive switch). No logic lives here.

const std = @import("std");
const build_options = @import("build_options");
const status = @import("status.zig");
const abi = @import("abi.zig");
const schema = @import("schema.zig");
const manifest = @import("manifest.zig");
const Runtime = @import("runtime.zig").Runtime;
const Writer = @import("writer.zig").Writer;
const WriterColumn = @import("writer.zig").Column;
const Dataset = @import("dataset.zig").Dataset;
const reader = @import("reader.zig");
const table = @import("table.zig");

const gpa = std.heap.c_allocator;

const Rc = i32;

fn ok() Rc {
    return @intFromEnum(status.Status.ok);
}

fn fromError(err: status.Error) Rc {
    if (err == error.OutOfMemory and status.lastMessage().len == 0) status.setMessage("out of memory");
    return @intFromEnum(status.toStatus(err));
}

fn nullArgument(comptime what: []const u8) Rc {
    return fromError(status.fail(error.InvalidArgument, what ++ " must not be NULL", .{}));
}

/// Runs `f(args...)` with a fresh message buffer and maps its result to a status, so
/// a failure without a message of its own (an allocation) never shows a stale one.
fn call(comptime f: anytype, args: anytype) Rc {
    status.clear();
    @call(.auto, f, args) catch |err| return fromError(err);
    return ok();
}

export fn drt_version() [*:0]const u8 {
    return build_options.version;
}

export fn drt_abi_version() u32 {
    return (abi.abi_version_major << 16) | abi.abi_version_minor;
}

export fn drt_last_error() [*:0]const u8 {
    return status.lastMessage().ptr;
}

// ---------------------------------------------------------------- runtime

export fn drt_runtime_open(num_workers: u64, out: ?*?*Runtime) Rc {
    const o = out orelse return nullArgument("out");
    status.clear();
    o.* = Runtime.open(gpa, num_workers) catch |err| return fromError(err);
    return ok();
}

export fn drt_runtime_close(rt: ?*Runtime) void {
    if (rt) |r| r.release();
}

// ----------------------------------------------------------------- writer

export fn drt_writer_open(
    rt: ?*Runtime,
    base_dir: ?[*]const u8,
    base_dir_len: u64,
    name: ?[*]const u8,
    name_len: u64,
    options: ?*const abi.WriterOptions,
    out: ?*?*Writer,
) Rc {
    const r = rt orelse return nullArgument("runtime");
    const o = out orelse return nullArgument("out");
    const opts = options orelse return nullArgument("options");
    const base = abi.Str{ .ptr = base_dir, .len = base_dir_len };
    const n = abi.Str{ .ptr = name, .len = name_len };
    status.clear();
    if (opts.flags & ~(abi.writer_profile | abi.writer_replace) != 0) return fromError(status.fail(error.InvalidArgument, "unknown writer flags 0x{x}", .{opts.flags}));
    const compression: manifest.Compression = switch (opts.compression) {
        0 => .none,
        1 => .lz4,
        else => return fromError(status.fail(error.InvalidArgument, "unsupported shard compression algorithm", .{})),
    };
    o.* = Writer.open(gpa, r, base.slice(), n.slice(), .{
        .max_shard_bytes = opts.max_shard_bytes,
        .prefetch_size = opts.prefetch_size,
        .compression = compression,
        .ratio = opts.compression_ratio,
        .profile = opts.flags & abi.writer_profile != 0,
        .replace = opts.flags & abi.writer_replace != 0,
        .fingerprint = if (opts.fingerprint) |fp| fp[0..@intCast(opts.fingerprint_len)] else null,
    }) catch |err| return fromError(err);
    return ok();
}

export fn drt_writer_set_schema(w: ?*Writer, fields: ?[*]const abi.Field, field_count: u64) Rc {
    const writer = w orelse return nullArgument("writer");
    if (field_count > 0 and fields == null) return nullArgument("fields");
    status.clear();
    const converted = gpa.alloc(schema.Field, @intCast(field_count)) catch return fromError(error.OutOfMemory);
    defer gpa.free(converted);
    for (converted, 0..) |*f, i| {
        const src = fields.?[i];
        if (src.reserved != 0) return fromError(status.fail(error.InvalidArgument, "drt_field.reserved must be 0", .{}));
        f.* = .{ .name = src.name.slice(), .kind = kindFrom(src.kind) catch |err| return fromError(err) };
    }
    return call(Writer.setSchema, .{ writer, converted });
}

fn kindFrom(kind: i32) status.Error!schema.Kind {
    return switch (kind) {
        0 => .bool,
        1 => .int,
        2 => .float,
        3 => .string,
        else => status.fail(error.InvalidArgument, "unknown metadata kind {d}", .{kind}),
    };
}

export fn drt_writer_append(w: ?*Writer, count: u64, payloads: ?[*]const u8, payload_offsets: ?[*]const u64, columns: ?[*]const abi.Column) Rc {
    const writer = w orelse return nullArgument("writer");
    const offsets = payload_offsets orelse return nullArgument("payload_offsets");
    const empty: [1]u8 = .{0};
    const data = payloads orelse &empty;
    status.clear();
    const cols = gpa.alloc(WriterColumn, writer.fields.len) catch return fromError(error.OutOfMemory);
    defer gpa.free(cols);
    if (writer.fields.len > 0 and columns == null) return nullArgument("columns");
    for (cols, 0..) |*c, i| {
        const src = columns.?[i];
        if (src.reserved != 0) return fromError(status.fail(error.InvalidArgument, "drt_column.reserved must be 0", .{}));
        c.* = .{ .kind = kindFrom(src.kind) catch |err| return fromError(err), .values = src.values, .offsets = src.offsets };
    }
    return call(Writer.append, .{ writer, count, data, offsets, cols.ptr });
}

export fn drt_writer_stats(w: ?*Writer, out: ?[*]abi.StageStats) Rc {
    const writer = w orelse return nullArgument("writer");
    const o = out orelse return nullArgument("out");
    @memcpy(o[0..writer.profile.stages.len], &writer.profile.stages);
    return ok();
}

export fn drt_writer_sample_count(w: ?*Writer, out: ?*u64) Rc {
    const writer = w orelse return nullArgument("writer");
    const o = out orelse return nullArgument("out");
    o.* = writer.sample_count;
    return ok();
}

export fn drt_writer_staging_path(w: ?*Writer, out: ?*abi.Str) Rc {
    const writer = w orelse return nullArgument("writer");
    const o = out orelse return nullArgument("out");
    o.* = abi.Str.from(writer.stagingPath());
    return ok();
}

export fn drt_writer_finish(w: ?*Writer) Rc {
    const writer = w orelse return nullArgument("writer");
    return call(Writer.finish, .{writer});
}

export fn drt_staging_sweep(base_dir: ?[*]const u8, base_dir_len: u64) Rc {
    status.clear();
    const base = abi.Str{ .ptr = base_dir, .len = base_dir_len };
    if (base.len == 0) return fromError(status.fail(error.InvalidArgument, "base_dir must not be empty", .{}));
    return call(Writer.sweepBase, .{base.slice()});
}

export fn drt_writer_close(w: ?*Writer) void {
    if (w) |writer| writer.close();
}

// ---------------------------------------------------------------- dataset

export fn drt_dataset_open(rt: ?*Runtime, paths: ?[*]const abi.Str, path_count: u64, options: ?*const abi.DatasetOptions, out: ?*?*Dataset) Rc {
    const r = rt orelse return nullArgument("runtime");
    const o = out orelse return nullArgument("out");
    const opts = options orelse return nullArgument("options");
    if (path_count > 0 and paths == null) return nullArgument("paths");
    status.clear();
    const slices = gpa.alloc([]const u8, @intCast(path_count)) catch return fromError(error.OutOfMemory);
    defer gpa.free(slices);
    for (slices, 0..) |*s, i| s.* = paths.?[i].slice();
    if (opts.sampling != abi.sampling_with_replacement and opts.sampling != abi.sampling_permutation) {
        return fromError(status.fail(error.InvalidArgument, "unknown sampling mode {d}", .{opts.sampling}));
    }
    if (opts.io_backend < abi.io_auto or opts.io_backend > abi.io_threads) {
        return fromError(status.fail(error.InvalidArgument, "unknown io_backend {d}", .{opts.io_backend}));
    }
    o.* = Dataset.open(gpa, r, slices, .{
        .seed = opts.seed,
        .prefetch_size = opts.prefetch_size,
        .shuffle = opts.shuffle != 0,
        .validate_cache = opts.validate_cache != 0,
        .io_backend = opts.io_backend,
        .permutation = opts.sampling == abi.sampling_permutation,
    }) catch |err| return fromError(err);
    return ok();
}

export fn drt_dataset_close(ds: ?*Dataset) void {
    if (ds) |d| d.release();
}

export fn drt_dataset_cache_count(ds: ?*Dataset, out: ?*u64) Rc {
    const d = ds orelse return nullArgument("dataset");
    const o = out orelse return nullArgument("out");
    o.* = d.caches.len;
    return ok();
}

export fn drt_dataset_field_count(ds: ?*Dataset, out: ?*u64) Rc {
    const d = ds orelse return nullArgument("dataset");
    const o = out orelse return nullArgument("out");
    o.* = d.fields.len;
    return ok();
}

export fn drt_dataset_io_backend(ds: ?*Dataset, out: ?*i32) Rc {
    const d = ds orelse return nullArgument("dataset");
    const o = out orelse return nullArgument("out");
    o.* = d.io_backend;
    return ok();
}

export fn drt_dataset_io_stats(ds: ?*Dataset, out: ?*abi.IoStats) Rc {
    const d = ds orelse return nullArgument("dataset");
    const o = out orelse return nullArgument("out");
    o.* = d.ioStats();
    return ok();
}

export fn drt_io_uring_available() i32 {
    return @intFromBool(@import("io/uring.zig").Ring.available());
}

export fn drt_sha256_implementation() [*:0]const u8 {
    const name = @import("sha256.zig").implementation();
    return if (std.mem.eql(u8, name, "sha-ni")) "sha-ni" else "portable";
}

export fn drt_dataset_cache_info(ds: ?*Dataset, i: u64, out: ?*abi.CacheInfo) Rc {
    const d = ds orelse return nullArgument("dataset");
    const o = out orelse return nullArgument("out");
    status.clear();
    if (i >= d.caches.len) return fromError(status.fail(error.InvalidArgument, "cache index {d} is out of range", .{i}));
    const c = &d.caches[@intCast(i)];
    const first = c.manifest.shards;
    o.* = .{
        .cache_id = c.cache_id,
        .sample_count = c.sampleCount(),
        .shard_count = c.manifest.shards.len,
        .format_version = c.manifest.format_version,
        .compression = if (first.len > 0) @intFromEnum(first[0].compression) else 0,
        .compression_ratio = if (first.len > 0) first[0].ratio else 1.0,
        .source_name = abi.Str.from(c.manifest.source_name),
        .path = abi.Str.from(c.path),
        .fingerprint = if (c.manifest.fingerprint) |fp| abi.Str.from(fp) else .{ .ptr = null, .len = 0 },
    };
    return ok();
}

export fn drt_dataset_field(ds: ?*Dataset, i: u64, out: ?*abi.Field) Rc {
    const d = ds orelse return nullArgument("dataset");
    const o = out orelse return nullArgument("out");
    status.clear();
    if (i >= d.fields.len) return fromError(status.fail(error.InvalidArgument, "field index {d} is out of range", .{i}));
    const f = d.fields[@intCast(i)];
    o.* = .{ .name = abi.Str.from(f.name), .kind = @intFromEnum(f.kind), .reserved = 0 };
    return ok();
}

export fn drt_dataset_set_table(
    ds: ?*Dataset,
    row_count: u64,
    cache_ids: ?*const abi.TableColumn,
    sample_ids: ?*const abi.TableColumn,
    weights: ?*const abi.TableColumn,
) Rc {
    const d = ds orelse return nullArgument("dataset");
    const cids = cache_ids orelse return nullArgument("cache_ids");
    const sids = sample_ids orelse return nullArgument("sample_ids");
    const w = weights orelse return nullArgument("weights");
    status.clear();
    if (cids.reserved != 0 or sids.reserved != 0 or w.reserved != 0) return fromError(status.fail(error.InvalidArgument, "drt_table_column.reserved must be 0", .{}));
    d.runtime.checkPid() catch |err| return fromError(err);
    const new_table = table.build(d, row_count, cids.*, sids.*, w.*) catch |err| return fromError(err);
    d.replaceTable(new_table);
    return ok();
}

export fn drt_dataset_epoch_len(ds: ?*Dataset, out: ?*u64) Rc {
    const d = ds orelse return nullArgument("dataset");
    const o = out orelse return nullArgument("out");
    o.* = d.epochLen();
    return ok();
}

export fn drt_dataset_set_epoch_len(ds: ?*Dataset, epoch_len: u64) Rc {
    const d = ds orelse return nullArgument("dataset");
    return call(Dataset.setEpochLen, .{ d, epoch_len });
}

export fn drt_dataset_stream(ds: ?*Dataset, out: ?*abi.Stream) Rc {
    const d = ds orelse return nullArgument("dataset");
    const o = out orelse return nullArgument("out");
    const s = d.stream();
    o.* = .{ .position = s.position, .window_end = s.window_end };
    return ok();
}

export fn drt_dataset_set_stream(ds: ?*Dataset, stream: ?*const abi.Stream) Rc {
    const d = ds orelse return nullArgument("dataset");
    const s = stream orelse return nullArgument("stream");
    return call(Dataset.setStream, .{ d, Dataset.Stream{ .position = s.position, .window_end = s.window_end } });
}

export fn drt_dataset_table_digest(ds: ?*Dataset, out: ?[*]u8) Rc {
    const d = ds orelse return nullArgument("dataset");
    const o = out orelse return nullArgument("out");
    o[0..32].* = d.tableDigest();
    return ok();
}

// ---------------------------------------------------------------- reading

export fn drt_iter_open(ds: ?*Dataset, out: ?*?*reader.Iter) Rc {
    const d = ds orelse return nullArgument("dataset");
    const o = out orelse return nullArgument("out");
    status.clear();
    o.* = reader.Iter.open(d) catch |err| return fromError(err);
    return ok();
}

export fn drt_iter_open_range(ds: ?*Dataset, range: ?*const abi.IterRange, out: ?*?*reader.Iter) Rc {
    const d = ds orelse return nullArgument("dataset");
    const r = range orelse return nullArgument("range");
    const o = out orelse return nullArgument("out");
    status.clear();
    o.* = reader.Iter.openRange(d, .{ .start = r.start, .count = r.count, .block_len = r.block_len, .block_stride = r.block_stride }) catch |err| return fromError(err);
    return ok();
}

export fn drt_iter_window(it: ?*reader.Iter, out: ?*abi.IterRange) Rc {
    const iter = it orelse return nullArgument("iter");
    const o = out orelse return nullArgument("out");
    const s = iter.schedule;
    o.* = .{ .start = s.start, .count = s.count, .block_len = s.block_len, .block_stride = s.block_stride };
    return ok();
}

export fn drt_iter_next_batch(it: ?*reader.Iter, max_count: u64, flags: u32, out: ?*abi.Batch) Rc {
    const iter = it orelse return nullArgument("iter");
    const o = out orelse return nullArgument("out");
    if (flags & ~reader.batch_contiguous != 0) return fromError(status.fail(error.InvalidArgument, "unknown batch flags 0x{x}", .{flags}));
    return call(reader.Iter.nextBatch, .{ iter, max_count, flags, o });
}

export fn drt_iter_close(it: ?*reader.Iter) void {
    if (it) |iter| iter.close();
}

export fn drt_lookup_open(ds: ?*Dataset, out: ?*?*reader.Lookup) Rc {
    const d = ds orelse return nullArgument("dataset");
    const o = out orelse return nullArgument("out");
    status.clear();
    o.* = reader.Lookup.open(d) catch |err| return fromError(err);
    return ok();
}

export fn drt_lookup_get(lk: ?*reader.Lookup, count: u64, cache_ids: ?[*]const u64, sample_ids: ?[*]const u64, flags: u32, out: ?*abi.Batch) Rc {
    const lookup = lk orelse return nullArgument("lookup");
    const o = out orelse return nullArgument("out");
    if (flags & ~reader.batch_contiguous != 0) return fromError(status.fail(error.InvalidArgument, "unknown batch flags 0x{x}", .{flags}));
    if (count > 0 and (cache_ids == null or sample_ids == null)) return nullArgument("cache_ids and sample_ids");
    const n: usize = @intCast(count);
    const empty: [0]u64 = .{};
    const cids = if (n > 0) cache_ids.?[0..n] else &empty;
    const sids = if (n > 0) sample_ids.?[0..n] else &empty;
    return call(reader.Lookup.get, .{ lookup, cids, sids, flags, o });
}

export fn drt_lookup_close(lk: ?*reader.Lookup) void {
    if (lk) |lookup| lookup.close();
}

test {
    std.testing.refAllDecls(@This());
    _ = @import("schema.zig");
    _ = @import("status.zig");
    _ = @import("abi.zig");
    _ = @import("manifest.zig");
    _ = @import("index.zig");
    _ = @import("shard.zig");
    _ = @import("runtime.zig");
    _ = @import("cache.zig");
    _ = @import("dataset.zig");
    _ = @import("reader.zig");
    _ = @import("table.zig");
    _ = @import("writer.zig");
    _ = @import("lz4.zig");
    _ = @import("metadata_json.zig");
    _ = @import("sampler.zig");
    _ = @import("chacha.zig");
    _ = @import("io/uring.zig");
    _ = @import("arrow.zig");
    _ = @import("sha256.zig");
}

// -------------------------------------------------------------- fragments

const Commit = @import("fragment.zig").Commit;

export fn drt_commit_open(
    base_dir: ?[*]const u8,
    base_dir_len: u64,
    name: ?[*]const u8,
    name_len: u64,
    fragments: ?[*]const abi.Str,
    fragment_count: u64,
    options: ?*const abi.CommitOptions,
    out: ?*?*Commit,
) Rc {
    const o = out orelse return nullArgument("out");
    const opts = options orelse return nullArgument("options");
    if (fragment_count > 0 and fragments == null) return nullArgument("fragments");
    status.clear();
    if (opts.flags & ~abi.commit_replace != 0) return fromError(status.fail(error.InvalidArgument, "unknown commit flags 0x{x}", .{opts.flags}));
    if (opts.reserved != 0) return fromError(status.fail(error.InvalidArgument, "drt_commit_options.reserved must be 0", .{}));
    const paths = gpa.alloc([]const u8, @intCast(fragment_count)) catch return fromError(error.OutOfMemory);
    defer gpa.free(paths);
    for (paths, 0..) |*p, i| p.* = fragments.?[i].slice();
    const base = abi.Str{ .ptr = base_dir, .len = base_dir_len };
    const n = abi.Str{ .ptr = name, .len = name_len };
    o.* = Commit.open(gpa, base.slice(), n.slice(), paths, .{ .replace = opts.flags & abi.commit_replace != 0 }) catch |err| return fromError(err);
    return ok();
}

export fn drt_commit_sample_count(c: ?*Commit, out: ?*u64) Rc {
    const commit = c orelse return nullArgument("commit");
    const o = out orelse return nullArgument("out");
    o.* = commit.sample_count;
    return ok();
}

export fn drt_commit_staging_path(c: ?*Commit, out: ?*abi.Str) Rc {
    const commit = c orelse return nullArgument("commit");
    const o = out orelse return nullArgument("out");
    o.* = abi.Str.from(commit.stagingPath());
    return ok();
}

export fn drt_commit_finish(c: ?*Commit) Rc {
    const commit = c orelse return nullArgument("commit");
    return call(Commit.finish, .{commit});
}

export fn drt_commit_close(c: ?*Commit) void {
    if (c) |commit| commit.close();
}

test {
    _ = @import("fragment.zig");
}
