//! The exported C ABI (dataset_rt.h). Each function is a thin wrapper: check the
//! arguments, call the Zig implementation, and map its error to a status code with
//! `status.toStatus` (an exhaustive switch). No logic lives here.

const std = @import("std");
const build_options = @import("build_options");
const status = @import("../base/status.zig");
const abi = @import("types.zig");
const schema = @import("../format/schema.zig");
const manifest = @import("../format/manifest.zig");
const Runtime = @import("../base/runtime.zig").Runtime;
const Writer = @import("../write/writer.zig").Writer;
const WriterColumn = @import("../write/writer.zig").Column;
const Dataset = @import("../read/dataset.zig").Dataset;
const iterator = @import("../read/iterator.zig");
const Iter = iterator.Iter;
const Lookup = @import("../read/lookup.zig").Lookup;
const batch = @import("../read/batch.zig");
const table = @import("../read/table.zig");
const io = @import("../io/backend.zig");
const remote = @import("../io/remote.zig");
const uring = @import("../io/uring.zig");
const sha256 = @import("../codec/sha256.zig");
const publish = @import("../store/publish.zig");
const migrate = @import("../store/migrate.zig");

const gpa = std.heap.c_allocator;

const Rc = i32;

/// Success: this thread's last error is cleared (a failure met and handled on the way,
/// such as a record a batch stopped before, leaves no message behind).
fn ok() Rc {
    status.clear();
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
    if (opts.flags & ~(abi.writer_profile | abi.writer_replace | abi.writer_metadata) != 0) return fromError(status.fail(error.InvalidArgument, "unknown writer flags 0x{x}", .{opts.flags}));
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
        .write_metadata = opts.flags & abi.writer_metadata != 0,
        .fingerprint = if (opts.fingerprint) |fp| fp[0..@intCast(opts.fingerprint_len)] else null,
    }) catch |err| return fromError(err);
    return ok();
}

export fn drt_writer_set_schema(w: ?*Writer, fields: ?[*]const abi.Field, field_count: u64) Rc {
    const writer = w orelse return nullArgument("writer");
    if (field_count > 0 and fields == null) return nullArgument("fields");
    status.clear();
    writer.runtime.checkPid() catch |err| return fromError(err);
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
    status.clear();
    // Without payload bytes, every payload must be empty.
    if (payloads == null and count > 0 and offsets[@intCast(count)] != offsets[0]) return nullArgument("payloads");
    const data = payloads orelse &empty;
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
    status.clear();
    writer.runtime.checkPid() catch |err| return fromError(err);
    writer.drain();
    for (o[0..writer.profile.stages.len], writer.profile.stages) |*dst, src| {
        dst.* = .{ .calls = src.calls, .total_ns = src.total_ns, .bytes = src.bytes };
    }
    return ok();
}

export fn drt_writer_sample_count(w: ?*Writer, out: ?*u64) Rc {
    const writer = w orelse return nullArgument("writer");
    const o = out orelse return nullArgument("out");
    status.clear();
    writer.runtime.checkPid() catch |err| return fromError(err);
    writer.drain();
    o.* = writer.sample_count;
    return ok();
}

export fn drt_writer_staging_path(w: ?*Writer, out: ?*abi.Str) Rc {
    const writer = w orelse return nullArgument("writer");
    const o = out orelse return nullArgument("out");
    status.clear();
    writer.runtime.checkPid() catch |err| return fromError(err);
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
    publish.checkBase(base.slice()) catch |err| return fromError(err);
    return call(publish.sweepBase, .{base.slice()});
}

export fn drt_writer_close(w: ?*Writer) void {
    if (w) |writer| writer.close();
}

// ---------------------------------------------------------------- dataset

export fn drt_dataset_open(rt: ?*Runtime, paths: ?[*]const abi.Str, path_count: u64, options: ?*const abi.DatasetOptions, out: ?*?*Dataset) Rc {
    return openDataset(rt, paths, path_count, options, null, out);
}

export fn drt_dataset_open_remote(rt: ?*Runtime, paths: ?[*]const abi.Str, path_count: u64, options: ?*const abi.DatasetOptions, rm: ?*remote.Remote, out: ?*?*Dataset) Rc {
    return openDataset(rt, paths, path_count, options, rm, out);
}

export fn drt_remote_open(options: ?*const abi.RemoteOptions, out: ?*?*remote.Remote) Rc {
    const opts = options orelse return nullArgument("options");
    const o = out orelse return nullArgument("out");
    status.clear();
    if (opts.reserved != 0) return fromError(status.fail(error.InvalidArgument, "drt_remote_options.reserved must be 0", .{}));
    o.* = remote.Remote.create(gpa, opts.ops, .{
        .root = opts.cache_dir.slice(),
        .budget = opts.budget_bytes,
        .retries = opts.retries,
    }) catch |err| return fromError(err);
    return ok();
}

export fn drt_remote_set_read_file(rm: ?*remote.Remote, read_file: ?remote.ReadFileFn) Rc {
    const r = rm orelse return nullArgument("remote");
    status.clear();
    r.checkPid() catch |err| return fromError(err);
    r.setReadFile(read_file);
    return ok();
}

export fn drt_remote_set_release(rm: ?*remote.Remote, release: ?remote.ReleaseFn) Rc {
    const r = rm orelse return nullArgument("remote");
    status.clear();
    r.checkPid() catch |err| return fromError(err);
    r.setRelease(release);
    return ok();
}

export fn drt_remote_close(rm: ?*remote.Remote) void {
    if (rm) |r| r.release();
}

export fn drt_dataset_cache_dir(ds: ?*Dataset, i: u64, out: ?*abi.Str) Rc {
    const d = ds orelse return nullArgument("dataset");
    const o = out orelse return nullArgument("out");
    status.clear();
    d.runtime.checkPid() catch |err| return fromError(err);
    if (i >= d.caches.len) return fromError(status.fail(error.InvalidArgument, "cache index {d} is out of range", .{i}));
    o.* = abi.Str.from(d.caches[@intCast(i)].path);
    return ok();
}

fn openDataset(rt: ?*Runtime, paths: ?[*]const abi.Str, path_count: u64, options: ?*const abi.DatasetOptions, rm: ?*remote.Remote, out: ?*?*Dataset) Rc {
    const r = rt orelse return nullArgument("runtime");
    const o = out orelse return nullArgument("out");
    const opts = options orelse return nullArgument("options");
    if (path_count > 0 and paths == null) return nullArgument("paths");
    status.clear();
    if (rm) |x| x.checkPid() catch |err| return fromError(err);
    const slices = gpa.alloc([]const u8, @intCast(path_count)) catch return fromError(error.OutOfMemory);
    defer gpa.free(slices);
    for (slices, 0..) |*s, i| {
        s.* = paths.?[i].slice();
        if (s.len == 0) return fromError(status.fail(error.InvalidArgument, "cache path {d} is empty", .{i}));
        if (std.mem.indexOfScalar(u8, s.*, 0) != null) return fromError(status.fail(error.InvalidArgument, "cache path {d} contains a NUL byte", .{i}));
    }
    if (opts.sampling != abi.sampling_with_replacement and opts.sampling != abi.sampling_permutation) {
        return fromError(status.fail(error.InvalidArgument, "unknown sampling mode {d}", .{opts.sampling}));
    }
    const io_backend: io.Choice = switch (opts.io_backend) {
        abi.io_auto => .auto,
        abi.io_uring => .io_uring,
        abi.io_threads => .threads,
        else => return fromError(status.fail(error.InvalidArgument, "unknown io_backend {d}", .{opts.io_backend})),
    };
    o.* = Dataset.open(gpa, r, slices, .{
        .seed = opts.seed,
        .prefetch_size = opts.prefetch_size,
        .shuffle = opts.shuffle != 0,
        .validate_cache = opts.validate_cache != 0,
        .name_every_damaged_file = opts.validate_cache == 2,
        .io_backend = io_backend,
        .permutation = opts.sampling == abi.sampling_permutation,
        .remote = rm,
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
    o.* = switch (d.io_kind) {
        .io_uring => abi.io_uring,
        .threads => abi.io_threads,
    };
    return ok();
}

export fn drt_dataset_io_stats(ds: ?*Dataset, out: ?*abi.IoStats) Rc {
    const d = ds orelse return nullArgument("dataset");
    const o = out orelse return nullArgument("out");
    const s = d.ioStats();
    o.* = .{ .uring_reads = s.uring_reads, .pool_reads = s.pool_reads, .lookup_reads = s.lookup_reads, .bytes_read = s.bytes_read };
    return ok();
}

export fn drt_io_uring_available() i32 {
    return @intFromBool(uring.available());
}

export fn drt_sha256_implementation() [*:0]const u8 {
    const name = sha256.implementation();
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
        .path = abi.Str.from(c.url orelse c.path),
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
    const cid_col = tableColumn(cids.*) catch |err| return fromError(err);
    const sid_col = tableColumn(sids.*) catch |err| return fromError(err);
    const w_col = tableColumn(w.*) catch |err| return fromError(err);
    const new_table = table.build(d, row_count, cid_col, sid_col, w_col) catch |err| return fromError(err);
    d.replaceTable(new_table);
    return ok();
}

/// The dataset's plain state (epoch length, stream, read-ahead budget) is usable in a
/// forked child (it is the child's copy) unless a thread of the parent held the dataset's
/// lock at the fork: that lock is never released, so the call fails instead of waiting.
fn plainStateUsable(d: *Dataset) status.Error!void {
    d.runtime.checkPid() catch |err| {
        if (!d.mutex.tryLock()) return err;
        d.mutex.unlock();
    };
}

export fn drt_dataset_epoch_len(ds: ?*Dataset, out: ?*u64) Rc {
    const d = ds orelse return nullArgument("dataset");
    const o = out orelse return nullArgument("out");
    status.clear();
    plainStateUsable(d) catch |err| return fromError(err);
    o.* = d.epochLen();
    return ok();
}

export fn drt_dataset_set_epoch_len(ds: ?*Dataset, epoch_len: u64) Rc {
    const d = ds orelse return nullArgument("dataset");
    status.clear();
    plainStateUsable(d) catch |err| return fromError(err);
    return call(Dataset.setEpochLen, .{ d, epoch_len });
}

export fn drt_dataset_set_prefetch_bytes(ds: ?*Dataset, prefetch_bytes: u64) Rc {
    const d = ds orelse return nullArgument("dataset");
    status.clear();
    plainStateUsable(d) catch |err| return fromError(err);
    d.setPrefetchBytes(prefetch_bytes);
    return ok();
}

export fn drt_dataset_stream(ds: ?*Dataset, out: ?*abi.Stream) Rc {
    const d = ds orelse return nullArgument("dataset");
    const o = out orelse return nullArgument("out");
    status.clear();
    plainStateUsable(d) catch |err| return fromError(err);
    const s = d.stream();
    o.* = .{ .position = s.position, .window_end = s.window_end };
    return ok();
}

export fn drt_dataset_set_stream(ds: ?*Dataset, stream: ?*const abi.Stream) Rc {
    const d = ds orelse return nullArgument("dataset");
    const s = stream orelse return nullArgument("stream");
    status.clear();
    plainStateUsable(d) catch |err| return fromError(err);
    d.setStream(.{ .position = s.position, .window_end = s.window_end });
    return ok();
}

export fn drt_dataset_table_digest(ds: ?*Dataset, out: ?[*]u8) Rc {
    const d = ds orelse return nullArgument("dataset");
    const o = out orelse return nullArgument("out");
    status.clear();
    d.runtime.checkPid() catch |err| return fromError(err);
    o[0..32].* = d.tableDigest();
    return ok();
}

fn tableColumn(c: abi.TableColumn) status.Error!table.Column {
    const value_type: table.ValueType = switch (c.type) {
        abi.type_other => .other,
        abi.type_u64 => .u64,
        abi.type_u32 => .u32,
        abi.type_i64 => .i64,
        abi.type_i32 => .i32,
        abi.type_f64 => .f64,
        abi.type_f32 => .f32,
        else => return status.fail(error.InvalidArgument, "unknown drt_table_column.type {d}", .{c.type}),
    };
    return .{ .type = value_type, .values = c.values, .validity = c.validity, .offset = c.offset };
}

// ---------------------------------------------------------------- reading

/// What `drt_iter` and `drt_lookup` point to: the reader and the `drt_column` array its
/// batches point into (valid, like the batch, until the next call on the handle).
fn BatchHandle(comptime Reader: type, comptime kind: []const u8) type {
    return struct {
        const Self = @This();
        reader: *Reader,
        columns: []abi.Column,
        /// Set while a call is inside the handle (see `enter`).
        busy: std.atomic.Value(bool) = .init(false),

        /// A handle is used by one thread at a time: a call made while another thread's
        /// call is inside it gets DRT_E_INVALID_ARGUMENT instead of corrupting the reader
        /// (one atomic swap per call). Pair with `leave`.
        fn enter(h: *Self) status.Error!void {
            if (h.busy.swap(true, .acquire)) {
                // A forked child inherits the flag of a call a parent thread was in:
                // the fork rule's error, not a thread's.
                try h.reader.ds.runtime.checkPid();
                return status.fail(error.InvalidArgument, "the " ++ kind ++ " is in use by another thread (a handle is used by one thread at a time)", .{});
            }
        }

        fn leave(h: *Self) void {
            h.busy.store(false, .release);
        }

        fn wrap(reader: *Reader) status.Error!*Self {
            errdefer reader.close();
            const columns = try gpa.alloc(abi.Column, reader.ds.fields.len);
            errdefer gpa.free(columns);
            const h = try gpa.create(Self);
            h.* = .{ .reader = reader, .columns = columns };
            return h;
        }

        fn close(h: *Self) void {
            // A forked child never touches inherited state (the reader's close is a no-op there).
            const forked = if (h.reader.ds.runtime.checkPid()) |_| false else |_| true;
            h.reader.close();
            if (forked) return;
            gpa.free(h.columns);
            gpa.destroy(h);
        }

        /// Lays `view` out as a `drt_batch`.
        fn publish(h: *Self, view: batch.View, out: *abi.Batch) void {
            std.debug.assert(view.columns.len == 0 or view.columns.len == h.columns.len);
            for (view.columns, h.columns[0..view.columns.len]) |src, *dst| {
                dst.* = .{ .kind = @intFromEnum(src.kind), .reserved = 0, .values = src.values, .offsets = src.offsets };
            }
            out.* = .{
                .count = view.count,
                .payloads = view.payloads,
                .payload_lens = view.payload_lens,
                .payload_base = view.payload_base,
                .payload_offsets = view.payload_offsets,
                .cache_ids = view.cache_ids,
                .sample_ids = view.sample_ids,
                .columns = if (view.count == 0) null else h.columns.ptr,
            };
        }
    };
}

const IterHandle = BatchHandle(Iter, "iterator");
const LookupHandle = BatchHandle(Lookup, "lookup");

/// Checks `flags` and returns whether the batch is contiguous; sets where the reader's
/// batch takes its metadata from (DRT_BATCH_STORED_METADATA) and whether an iterator's
/// contiguous batch is bounded by the byte budget (DRT_BATCH_BOUNDED; lookups take
/// exactly the identities asked for and ignore it).
fn batchFlags(batch_buffers: *batch.Buffers, flags: u32) status.Error!bool {
    if (flags & ~(abi.batch_contiguous | abi.batch_stored_metadata | abi.batch_bounded) != 0) return status.fail(error.InvalidArgument, "unknown batch flags 0x{x}", .{flags});
    batch_buffers.stored_metadata = flags & abi.batch_stored_metadata != 0;
    batch_buffers.bounded = flags & abi.batch_bounded != 0;
    return flags & abi.batch_contiguous != 0;
}

export fn drt_iter_open(ds: ?*Dataset, out: ?*?*IterHandle) Rc {
    const d = ds orelse return nullArgument("dataset");
    const o = out orelse return nullArgument("out");
    status.clear();
    const it = Iter.open(d) catch |err| return fromError(err);
    o.* = IterHandle.wrap(it) catch |err| return fromError(err);
    return ok();
}

export fn drt_iter_open_range(ds: ?*Dataset, range: ?*const abi.IterRange, out: ?*?*IterHandle) Rc {
    const d = ds orelse return nullArgument("dataset");
    const r = range orelse return nullArgument("range");
    const o = out orelse return nullArgument("out");
    status.clear();
    const it = Iter.openRange(d, .{ .start = r.start, .count = r.count, .block_len = r.block_len, .block_stride = r.block_stride }) catch |err| return fromError(err);
    o.* = IterHandle.wrap(it) catch |err| return fromError(err);
    return ok();
}

export fn drt_iter_window(it: ?*IterHandle, out: ?*abi.IterRange) Rc {
    const h = it orelse return nullArgument("iter");
    const o = out orelse return nullArgument("out");
    const s = h.reader.schedule;
    o.* = .{ .start = s.start, .count = s.count, .block_len = s.block_len, .block_stride = s.block_stride };
    return ok();
}

export fn drt_iter_next_batch(it: ?*IterHandle, max_count: u64, flags: u32, out: ?*abi.Batch) Rc {
    const h = it orelse return nullArgument("iter");
    const o = out orelse return nullArgument("out");
    status.clear();
    h.enter() catch |err| return fromError(err);
    defer h.leave();
    const contiguous = batchFlags(&h.reader.batch, flags) catch |err| return fromError(err);
    const view = h.reader.nextBatch(max_count, contiguous) catch |err| return fromError(err);
    h.publish(view, o);
    return ok();
}

export fn drt_iter_next_batch_into(it: ?*IterHandle, max_count: u64, flags: u32, dst: ?[*]u8, capacity: u64, out: ?*abi.Batch) Rc {
    const h = it orelse return nullArgument("iter");
    const o = out orelse return nullArgument("out");
    status.clear();
    h.enter() catch |err| return fromError(err);
    defer h.leave();
    _ = batchFlags(&h.reader.batch, flags) catch |err| return fromError(err);
    const dest: []u8 = if (dst) |d| d[0..@intCast(capacity)] else &.{};
    const view = h.reader.nextBatchInto(max_count, dest) catch |err| return fromError(err);
    h.publish(view, o);
    return ok();
}

export fn drt_iter_stage_batch(it: ?*IterHandle, max_count: u64, dst: ?[*]u8, capacity: u64, out_needed: ?*u64) Rc {
    const h = it orelse return nullArgument("iter");
    const o = out_needed orelse return nullArgument("out_needed");
    status.clear();
    h.enter() catch |err| return fromError(err);
    defer h.leave();
    const dest: []u8 = if (dst) |d| d[0..@intCast(capacity)] else &.{};
    o.* = h.reader.stageBatch(max_count, dest) catch |err| return fromError(err);
    return ok();
}

export fn drt_iter_give_payload_buffers(it: ?*IterHandle, buffers: ?[*]const ?[*]u8, lens: ?[*]const u64, count: u64, flags: u32, out_taken: ?*u64, out_budget: ?*u64) Rc {
    const h = it orelse return nullArgument("iter");
    const taken = out_taken orelse return nullArgument("out_taken");
    const budget = out_budget orelse return nullArgument("out_budget");
    status.clear();
    h.enter() catch |err| return fromError(err);
    defer h.leave();
    h.reader.ds.runtime.checkPid() catch |err| return fromError(err);
    if (flags & ~@as(u32, abi.payload_buffers_reset) != 0) return fromError(status.fail(error.InvalidArgument, "unknown payload buffer flags 0x{x}", .{flags}));
    const n: usize = @intCast(count);
    var bufs: std.ArrayList([]u8) = .empty;
    defer bufs.deinit(h.reader.ds.gpa);
    if (n > 0) {
        const ptrs = (buffers orelse return nullArgument("buffers"))[0..n];
        const ls = (lens orelse return nullArgument("lens"))[0..n];
        bufs.ensureTotalCapacity(h.reader.ds.gpa, n) catch |err| return fromError(err);
        for (ptrs, ls) |p, len| {
            const b = p orelse return nullArgument("buffers[i]");
            bufs.appendAssumeCapacity(b[0..@intCast(len)]);
        }
    }
    taken.* = h.reader.givePayloadBuffers(bufs.items, flags & abi.payload_buffers_reset != 0) catch |err| return fromError(err);
    budget.* = h.reader.budget;
    return ok();
}

export fn drt_batch_copy_payloads(b: ?*const abi.Batch, dst: ?[*]u8, capacity: u64, out_len: ?*u64) Rc {
    const bt = b orelse return nullArgument("batch");
    const o = out_len orelse return nullArgument("out_len");
    status.clear();
    const n: usize = @intCast(bt.count);
    o.* = 0;
    if (n == 0) return ok();
    const lens = (bt.payload_lens orelse return nullArgument("batch.payload_lens"))[0..n];
    const payloads = (bt.payloads orelse return nullArgument("batch.payloads"))[0..n];
    var total: u64 = 0;
    for (lens) |len| total = std.math.add(u64, total, len) catch
        return fromError(status.fail(error.Overflow, "the payload lengths of the batch add up to more than 2^64 bytes", .{}));
    o.* = total;
    if (total > capacity) return fromError(status.fail(error.InvalidArgument, "the payloads take {d} bytes, the buffer has {d}", .{ total, capacity }));
    if (total == 0) return ok();
    const d = dst orelse return nullArgument("dst");
    // `dst` may hold payloads only where they are to be copied (the batch's own
    // contiguous buffer): any other overlap would overwrite bytes not yet copied.
    const lo = @intFromPtr(d);
    const hi = lo + @as(usize, @intCast(total));
    var at: usize = 0;
    for (payloads, lens, 0..) |p, len, i| {
        const from = @intFromPtr(p);
        const size: usize = @intCast(len);
        if (size > 0 and from < hi and from + size > lo and from != lo + at) {
            return fromError(status.fail(error.InvalidArgument, "dst overlaps payload {d} of the batch (only a batch's own contiguous payload buffer may be passed, where its payloads already lie)", .{i}));
        }
        at += size;
    }
    batch.gatherPayloads(d[0..@intCast(total)], payloads, lens);
    return ok();
}

test "drt_batch_copy_payloads gathers payloads back to back" {
    const a = "abc";
    const b2 = "";
    const c = "defg";
    const ptrs = [_][*]const u8{ a.ptr, b2.ptr, c.ptr };
    const lens = [_]u64{ 3, 0, 4 };
    const bt: abi.Batch = .{ .count = 3, .payloads = &ptrs, .payload_lens = &lens, .payload_base = null, .payload_offsets = null, .cache_ids = null, .sample_ids = null, .columns = null };
    var buf: [8]u8 = undefined;
    var len: u64 = 99;
    try std.testing.expectEqual(@as(Rc, 0), drt_batch_copy_payloads(&bt, &buf, buf.len, &len));
    try std.testing.expectEqual(@as(u64, 7), len);
    try std.testing.expectEqualStrings("abcdefg", buf[0..7]);
    try std.testing.expect(drt_batch_copy_payloads(&bt, &buf, 6, &len) != 0);
    try std.testing.expectEqual(@as(u64, 7), len);
    const empty: abi.Batch = .{ .count = 0, .payloads = null, .payload_lens = null, .payload_base = null, .payload_offsets = null, .cache_ids = null, .sample_ids = null, .columns = null };
    try std.testing.expectEqual(@as(Rc, 0), drt_batch_copy_payloads(&empty, null, 0, &len));
    try std.testing.expectEqual(@as(u64, 0), len);
    // Lengths that cannot all exist add up past 2^64: a status, not a panic.
    const huge = [_]u64{ std.math.maxInt(u64), 1, 0 };
    const bad: abi.Batch = .{ .count = 3, .payloads = &ptrs, .payload_lens = &huge, .payload_base = null, .payload_offsets = null, .cache_ids = null, .sample_ids = null, .columns = null };
    try std.testing.expectEqual(@as(Rc, @intFromEnum(status.Status.overflow)), drt_batch_copy_payloads(&bad, &buf, buf.len, &len));
    // Into the batch's own contiguous buffer: nothing moves. Any other overlap: refused,
    // nothing copied.
    var own = "abcdefg".*;
    const in_place = [_][*]const u8{ &own, own[3..].ptr, own[3..].ptr };
    const own_batch: abi.Batch = .{ .count = 3, .payloads = &in_place, .payload_lens = &lens, .payload_base = &own, .payload_offsets = null, .cache_ids = null, .sample_ids = null, .columns = null };
    try std.testing.expectEqual(@as(Rc, 0), drt_batch_copy_payloads(&own_batch, &own, own.len, &len));
    try std.testing.expectEqualStrings("abcdefg", &own);
    const shifted = [_][*]const u8{ own[1..].ptr, own[3..].ptr, own[3..].ptr };
    const shifted_batch: abi.Batch = .{ .count = 3, .payloads = &shifted, .payload_lens = &lens, .payload_base = null, .payload_offsets = null, .cache_ids = null, .sample_ids = null, .columns = null };
    try std.testing.expectEqual(@as(Rc, -1), drt_batch_copy_payloads(&shifted_batch, &own, own.len, &len));
    try std.testing.expectEqualStrings("dst overlaps payload 0 of the batch (only a batch's own contiguous payload buffer may be passed, where its payloads already lie)", status.lastMessage());
    try std.testing.expectEqualStrings("abcdefg", &own);
}

export fn drt_batch_run(b: ?*const abi.Batch, out_cache_id: ?*u64, out_first: ?*u64, out_len: ?*u64) Rc {
    const bt = b orelse return nullArgument("batch");
    const cache_id = out_cache_id orelse return nullArgument("out_cache_id");
    const first = out_first orelse return nullArgument("out_first");
    const len = out_len orelse return nullArgument("out_len");
    status.clear();
    const n: usize = @intCast(bt.count);
    if (n == 0) {
        cache_id.*, first.*, len.* = .{ 0, 0, 0 };
        return ok();
    }
    const cids = (bt.cache_ids orelse return nullArgument("batch.cache_ids"))[0..n];
    const sids = (bt.sample_ids orelse return nullArgument("batch.sample_ids"))[0..n];
    var k: usize = 1;
    while (k < n and cids[k] == cids[0] and sids[k] == sids[0] +% k) k += 1;
    cache_id.* = cids[0];
    first.* = sids[0];
    len.* = k;
    return ok();
}

test "drt_batch_run measures the leading run of one cache's consecutive samples" {
    const cids = [_]u64{ 7, 7, 7, 7, 8, 8 };
    const sids = [_]u64{ 4, 5, 6, 8, 9, 10 };
    var bt: abi.Batch = .{ .count = 6, .payloads = null, .payload_lens = null, .payload_base = null, .payload_offsets = null, .cache_ids = &cids, .sample_ids = &sids, .columns = null };
    var cache_id: u64 = 99;
    var first: u64 = 99;
    var len: u64 = 99;
    try std.testing.expectEqual(@as(Rc, 0), drt_batch_run(&bt, &cache_id, &first, &len));
    try std.testing.expectEqual([3]u64{ 7, 4, 3 }, [3]u64{ cache_id, first, len });
    bt.count = 3;
    try std.testing.expectEqual(@as(Rc, 0), drt_batch_run(&bt, &cache_id, &first, &len));
    try std.testing.expectEqual([3]u64{ 7, 4, 3 }, [3]u64{ cache_id, first, len });
    // Another cache ends a run even where the sample ids go on.
    bt.cache_ids = cids[2..];
    bt.sample_ids = &.{ 6, 7, 8, 9 };
    bt.count = 4;
    try std.testing.expectEqual(@as(Rc, 0), drt_batch_run(&bt, &cache_id, &first, &len));
    try std.testing.expectEqual([3]u64{ 7, 6, 2 }, [3]u64{ cache_id, first, len });
    bt.count = 0;
    try std.testing.expectEqual(@as(Rc, 0), drt_batch_run(&bt, &cache_id, &first, &len));
    try std.testing.expectEqual([3]u64{ 0, 0, 0 }, [3]u64{ cache_id, first, len });
    try std.testing.expect(drt_batch_run(&bt, null, &first, &len) != 0);
}

export fn drt_column_string_views(column: ?*const abi.Column, count: u64, views: ?[*]u8, capacity: u64, out_data_len: ?*u64) Rc {
    const col = column orelse return nullArgument("column");
    const o = out_data_len orelse return nullArgument("out_data_len");
    status.clear();
    if (col.kind != @intFromEnum(schema.Kind.string)) return fromError(status.fail(error.InvalidArgument, "column is not a string column (kind {d})", .{col.kind}));
    if (count == 0) {
        o.* = 0;
        return ok();
    }
    const need = std.math.mul(u64, count, batch.string_view_bytes) catch return fromError(status.fail(error.Overflow, "{d} views do not fit in memory", .{count}));
    if (capacity < need) return fromError(status.fail(error.InvalidArgument, "{d} views take {d} bytes, the buffer has {d}", .{ count, need, capacity }));
    const v = views orelse return nullArgument("views");
    const offsets = (col.offsets orelse return nullArgument("column.offsets"))[0..@intCast(count + 1)];
    const values: [*]const u8 = if (col.values) |p| @ptrCast(p) else if (offsets[offsets.len - 1] == 0) &.{} else return nullArgument("column.values");
    o.* = batch.stringViews(offsets, values, v[0..@intCast(need)]) catch |err| return fromError(switch (err) {
        error.Overflow => status.fail(error.Overflow, "a string column of {d} bytes does not fit Arrow's 32-bit view offsets", .{offsets[offsets.len - 1]}),
        error.InvalidArgument => status.fail(error.InvalidArgument, "the column's offsets decrease", .{}),
    });
    return ok();
}

test "drt_column_string_views writes views of a string column, refuses others" {
    const values = "xythe fourteen b";
    const offsets = [_]u64{ 0, 2, 16 };
    const col: abi.Column = .{ .kind = @intFromEnum(schema.Kind.string), .reserved = 0, .values = values.ptr, .offsets = &offsets };
    var views: [32]u8 = undefined;
    var data_len: u64 = 99;
    try std.testing.expectEqual(@as(Rc, 0), drt_column_string_views(&col, 2, &views, views.len, &data_len));
    try std.testing.expectEqual(@as(u64, 16), data_len);
    try std.testing.expectEqualSlices(u8, &.{ 2, 0, 0, 0, 'x', 'y' }, views[0..6]);
    try std.testing.expectEqualSlices(u8, &.{ 14, 0, 0, 0, 't', 'h', 'e', ' ', 0, 0, 0, 0, 2, 0, 0, 0 }, views[16..32]);
    try std.testing.expect(drt_column_string_views(&col, 2, &views, 31, &data_len) != 0);
    try std.testing.expectEqualStrings("2 views take 32 bytes, the buffer has 31", status.lastMessage());
    const ints: abi.Column = .{ .kind = @intFromEnum(schema.Kind.int), .reserved = 0, .values = values.ptr, .offsets = null };
    try std.testing.expect(drt_column_string_views(&ints, 2, &views, views.len, &data_len) != 0);
    try std.testing.expectEqual(@as(Rc, 0), drt_column_string_views(&col, 0, null, 0, &data_len));
    try std.testing.expectEqual(@as(u64, 0), data_len);
}

export fn drt_iter_close(it: ?*IterHandle) void {
    if (it) |h| h.close();
}

export fn drt_lookup_open(ds: ?*Dataset, out: ?*?*LookupHandle) Rc {
    const d = ds orelse return nullArgument("dataset");
    const o = out orelse return nullArgument("out");
    status.clear();
    const lk = Lookup.open(d) catch |err| return fromError(err);
    o.* = LookupHandle.wrap(lk) catch |err| return fromError(err);
    return ok();
}

export fn drt_lookup_get(lk: ?*LookupHandle, count: u64, cache_ids: ?[*]const u64, sample_ids: ?[*]const u64, flags: u32, out: ?*abi.Batch) Rc {
    const h = lk orelse return nullArgument("lookup");
    const o = out orelse return nullArgument("out");
    status.clear();
    h.enter() catch |err| return fromError(err);
    defer h.leave();
    const contiguous = batchFlags(&h.reader.batch, flags) catch |err| return fromError(err);
    if (count > 0 and (cache_ids == null or sample_ids == null)) return nullArgument("cache_ids and sample_ids");
    const n: usize = @intCast(count);
    const empty: [0]u64 = .{};
    const cids = if (n > 0) cache_ids.?[0..n] else &empty;
    const sids = if (n > 0) sample_ids.?[0..n] else &empty;
    const view = h.reader.get(cids, sids, contiguous) catch |err| return fromError(err);
    h.publish(view, o);
    return ok();
}

export fn drt_lookup_stored_rows(lk: ?*LookupHandle, cache_id: u64, first: u64, count: u64, out: ?*abi.Batch) Rc {
    const h = lk orelse return nullArgument("lookup");
    const o = out orelse return nullArgument("out");
    status.clear();
    h.enter() catch |err| return fromError(err);
    defer h.leave();
    const view = h.reader.storedRows(cache_id, first, count) catch |err| return fromError(err);
    h.publish(view, o);
    return ok();
}

export fn drt_lookup_get_row(lk: ?*LookupHandle, cache_id: u64, sample_id: u64, dst: ?[*]u8, capacity: u64) Rc {
    const h = lk orelse return nullArgument("lookup");
    const d = dst orelse return nullArgument("dst");
    status.clear();
    h.enter() catch |err| return fromError(err);
    defer h.leave();
    if (capacity < 8) return fromError(status.fail(error.InvalidArgument, "drt_lookup_get_row needs a capacity of at least 8 bytes, got {d}", .{capacity}));
    h.reader.batch.stored_metadata = false;
    _ = h.reader.getRow(cache_id, sample_id, d[0..@intCast(capacity)]) catch |err| return fromError(err);
    return ok();
}

export fn drt_lookup_set_row_buffer(lk: ?*LookupHandle, dst: ?[*]u8, capacity: u64) Rc {
    const h = lk orelse return nullArgument("lookup");
    status.clear();
    h.enter() catch |err| return fromError(err);
    defer h.leave();
    h.reader.ds.runtime.checkPid() catch |err| return fromError(err);
    const d = dst orelse {
        h.reader.setRowBuffer(&.{});
        return ok();
    };
    if (capacity < 8) return fromError(status.fail(error.InvalidArgument, "drt_lookup_set_row_buffer needs a capacity of at least 8 bytes, got {d}", .{capacity}));
    h.reader.setRowBuffer(d[0..@intCast(capacity)]);
    return ok();
}

/// The packed size, or the (negative) status.
export fn drt_lookup_row(lk: ?*LookupHandle, cache_id: u64, sample_id: u64) i64 {
    const h = lk orelse return nullArgument("lookup");
    status.clear();
    h.enter() catch |err| return fromError(err);
    defer h.leave();
    h.reader.batch.stored_metadata = false;
    const size = h.reader.getRegisteredRow(cache_id, sample_id) catch |err| return fromError(err);
    return std.math.cast(i64, size) orelse fromError(status.fail(error.Overflow, "a packed row of {d} bytes does not fit in an int64", .{size}));
}

export fn drt_lookup_close(lk: ?*LookupHandle) void {
    if (lk) |h| h.close();
}

// -------------------------------------------------------------- fragments

const Commit = @import("../write/fragment.zig").Commit;

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
    status.clear();
    commit.checkPid() catch |err| return fromError(err);
    o.* = commit.sample_count;
    return ok();
}

export fn drt_commit_staging_path(c: ?*Commit, out: ?*abi.Str) Rc {
    const commit = c orelse return nullArgument("commit");
    const o = out orelse return nullArgument("out");
    status.clear();
    commit.checkPid() catch |err| return fromError(err);
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

// ----------------------------------------------------------- files on disk

export fn drt_source_name_check(name: ?[*]const u8, name_len: u64) Rc {
    const n = abi.Str{ .ptr = name, .len = name_len };
    return call(publish.checkName, .{n.slice()});
}

export fn drt_manifest_migrate(manifest_path: ?[*]const u8, manifest_path_len: u64, cache_id: u64, out: ?*i32) Rc {
    const o = out orelse return nullArgument("out");
    const path = (abi.Str{ .ptr = manifest_path, .len = manifest_path_len }).slice();
    status.clear();
    if (path.len == 0 or std.mem.indexOfScalar(u8, path, 0) != null) return fromError(status.fail(error.InvalidArgument, "invalid manifest path", .{}));
    const outcome = migrate.migrateManifest(gpa, path, cache_id) catch |err| return fromError(err);
    o.* = switch (outcome) {
        .unchanged => abi.migrate_unchanged,
        .updated => abi.migrate_updated,
        .durability_unknown => abi.migrate_durability_unknown,
    };
    return ok();
}

export fn drt_dataset_migrate_manifests(ds: ?*Dataset, entries: ?[*]abi.ManifestEntry, entry_count: u64, out_done: ?*u64, out_failed: ?*u64) Rc {
    const d = ds orelse return nullArgument("dataset");
    const done = out_done orelse return nullArgument("out_done");
    const failed = out_failed orelse return nullArgument("out_failed");
    if (entry_count > 0 and entries == null) return nullArgument("entries");
    status.clear();
    done.* = 0;
    failed.* = entry_count;
    if (entry_count != d.caches.len) return fromError(status.fail(error.InvalidArgument, "entry_count {d} is not the cache count {d}", .{ entry_count, d.caches.len }));
    const zig_entries = gpa.alloc(migrate.Entry, d.caches.len) catch return fromError(error.OutOfMemory);
    defer gpa.free(zig_entries);
    @memset(zig_entries, .{});
    var progress: migrate.Progress = .{};
    const result = d.migrateManifests(zig_entries, &progress);
    for (zig_entries, 0..) |entry, i| {
        entries.?[i] = .{
            .path = abi.Str.from(entry.path),
            .cache_id = entry.cache_id,
            .outcome = switch (entry.outcome) {
                .unchanged => abi.migrate_unchanged,
                .updated => abi.migrate_updated,
                .durability_unknown => abi.migrate_durability_unknown,
            },
            .reserved = 0,
        };
    }
    done.* = progress.done;
    if (progress.failed) |i| failed.* = i;
    result catch |err| return fromError(err);
    return ok();
}

export fn drt_file_publish(dir: ?[*]const u8, dir_len: u64, name: ?[*]const u8, name_len: u64, data: ?[*]const u8, data_len: u64, flags: u32, out_durable: ?*i32) Rc {
    const o = out_durable orelse return nullArgument("out_durable");
    if (data_len > 0 and data == null) return nullArgument("data");
    const d = (abi.Str{ .ptr = dir, .len = dir_len }).slice();
    const n = (abi.Str{ .ptr = name, .len = name_len }).slice();
    status.clear();
    if (flags & ~abi.publish_replace != 0) return fromError(status.fail(error.InvalidArgument, "unknown publish flags 0x{x}", .{flags}));
    if (d.len == 0 or std.mem.indexOfScalar(u8, d, 0) != null) return fromError(status.fail(error.InvalidArgument, "invalid directory path", .{}));
    const bytes = if (data_len > 0) data.?[0..@intCast(data_len)] else &[_]u8{};
    const durability = publish.publishFile(gpa, d, n, bytes, flags & abi.publish_replace != 0) catch |err| return fromError(err);
    o.* = @intFromBool(durability == .durable);
    return ok();
}

test "misuse through the C ABI gets a status, never a panic or a hang" {
    const t = std.testing;
    const invalid: Rc = -1;
    const forked_rc: Rc = -8;
    var rt: ?*Runtime = null;
    try t.expectEqual(@as(Rc, 0), drt_runtime_open(2, &rt));
    defer drt_runtime_close(rt);
    const fixture = try std.fs.path.join(t.allocator, &.{ build_options.fixtures_dir, "plain_one_shard" });
    defer t.allocator.free(fixture);
    const options: abi.DatasetOptions = .{ .seed = 1, .prefetch_size = 8, .shuffle = 0, .validate_cache = 0, .io_backend = abi.io_threads, .sampling = abi.sampling_with_replacement };
    var ds: ?*Dataset = null;

    // Paths: empty, or with a NUL byte (the file system calls cannot take them).
    for ([_][]const u8{ "", "a\x00b" }) |bad| {
        const paths = [_]abi.Str{abi.Str.from(bad)};
        try t.expectEqual(invalid, drt_dataset_open(rt, &paths, 1, &options, &ds));
    }
    try t.expectEqualStrings("cache path 0 contains a NUL byte", status.lastMessage());
    try t.expectEqual(invalid, drt_staging_sweep("a\x00b", 3));

    // Without payload bytes, payloads must be empty.
    var tmp = t.tmpDir(.{});
    defer tmp.cleanup();
    const base = try tmp.dir.realpathAlloc(t.allocator, ".");
    defer t.allocator.free(base);
    const wopts: abi.WriterOptions = .{ .max_shard_bytes = 1 << 20, .prefetch_size = std.math.maxInt(u64), .compression = 0, .flags = 0, .compression_ratio = 1.0, .fingerprint = null, .fingerprint_len = 0 };
    var w: ?*Writer = null;
    try t.expectEqual(@as(Rc, 0), drt_writer_open(rt, base.ptr, base.len, "w", 1, &wopts, &w));
    defer drt_writer_close(w);
    try t.expectEqual(@as(Rc, 0), drt_writer_set_schema(w, null, 0));
    const offsets = [_]u64{ 0, 100000 };
    try t.expectEqual(invalid, drt_writer_append(w, 1, null, &offsets, null));
    try t.expectEqualStrings("payloads must not be NULL", status.lastMessage());
    // prefetch_size 2**64-1 bounds nothing, and overflows nothing.
    const empty = [_]u64{ 0, 0 };
    try t.expectEqual(@as(Rc, 0), drt_writer_append(w, 1, null, &empty, null));
    // The sample count counts every append that returned, however far the pool is.
    {
        var w2: ?*Writer = null;
        try t.expectEqual(@as(Rc, 0), drt_writer_open(rt, base.ptr, base.len, "counted", 7, &wopts, &w2));
        defer drt_writer_close(w2);
        try t.expectEqual(@as(Rc, 0), drt_writer_set_schema(w2, null, 0));
        const zeros = [_]u64{0} ** 257;
        var appended: u64 = 0;
        var count: u64 = 0;
        for (0..20) |_| {
            try t.expectEqual(@as(Rc, 0), drt_writer_append(w2, 256, null, &zeros, null));
            appended += 256;
            try t.expectEqual(@as(Rc, 0), drt_writer_sample_count(w2, &count));
            try t.expectEqual(appended, count);
        }
    }

    const paths = [_]abi.Str{abi.Str.from(fixture)};
    try t.expectEqual(@as(Rc, 0), drt_dataset_open(rt, &paths, 1, &options, &ds));
    defer drt_dataset_close(ds);
    // A batch of any size after the first (2**64-1: "everything left").
    var it: ?*IterHandle = null;
    try t.expectEqual(@as(Rc, 0), drt_iter_open(ds, &it));
    defer drt_iter_close(it);
    var b: abi.Batch = undefined;
    try t.expectEqual(@as(Rc, 0), drt_iter_next_batch(it, 1, abi.batch_contiguous, &b));
    try t.expectEqual(@as(Rc, 0), drt_iter_next_batch(it, std.math.maxInt(u64), abi.batch_contiguous, &b));
    try t.expectEqual(@as(u64, 119), b.count);
    // Output parameters are written only on success.
    var needed: u64 = 77;
    try t.expect(drt_iter_stage_batch(it, 0, null, 0, &needed) != 0);
    try t.expectEqual(@as(u64, 77), needed);
    // A call while another thread is inside the handle is refused, and leaves it usable.
    it.?.busy.store(true, .monotonic);
    try t.expectEqual(invalid, drt_iter_next_batch(it, 1, 0, &b));
    try t.expectEqualStrings("the iterator is in use by another thread (a handle is used by one thread at a time)", status.lastMessage());
    // A child forked while a parent thread was inside the handle: DRT_E_FORKED.
    {
        const pid = try std.posix.fork();
        if (pid == 0) std.posix.exit(if (drt_iter_next_batch(it, 1, 0, &b) == forked_rc) 0 else 1);
        const result = std.posix.waitpid(pid, 0);
        try t.expect(std.posix.W.IFEXITED(result.status) and std.posix.W.EXITSTATUS(result.status) == 0);
    }
    it.?.busy.store(false, .monotonic);
    try t.expectEqual(@as(Rc, 0), drt_iter_next_batch(it, 1, 0, &b));
    // Two threads sharing one lookup: every call either reads its row or is refused.
    var lk: ?*LookupHandle = null;
    try t.expectEqual(@as(Rc, 0), drt_lookup_open(ds, &lk));
    defer drt_lookup_close(lk);
    var row_buf: [4096]u8 align(8) = undefined;
    try t.expectEqual(@as(Rc, 0), drt_lookup_set_row_buffer(lk, &row_buf, row_buf.len));
    var cache_id_buf: abi.CacheInfo = undefined;
    try t.expectEqual(@as(Rc, 0), drt_dataset_cache_info(ds, 0, &cache_id_buf));
    const Hammer = struct {
        fn run(h: ?*LookupHandle, cache_id: u64, bad: *std.atomic.Value(u32)) void {
            var i: u64 = 0;
            while (i < 20_000) : (i += 1) {
                const rc = drt_lookup_row(h, cache_id, i % 120);
                if (rc < 0 and rc != invalid_rc) _ = bad.fetchAdd(1, .monotonic);
            }
        }
        const invalid_rc: i64 = -1;
    };
    var bad = std.atomic.Value(u32).init(0);
    const other = try std.Thread.spawn(.{}, Hammer.run, .{ lk, cache_id_buf.cache_id, &bad });
    Hammer.run(lk, cache_id_buf.cache_id, &bad);
    other.join();
    try t.expectEqual(@as(u32, 0), bad.load(.monotonic));

    // In a forked child, the plain state works unless the parent held the dataset's lock
    // at the fork (then it never comes free): DRT_E_FORKED, not a hang.
    for ([_]bool{ true, false }) |held| {
        if (held) ds.?.mutex.lock();
        const pid = try std.posix.fork();
        if (pid == 0) {
            var len: u64 = 0;
            const want: Rc = if (held) forked_rc else 0;
            const ok_all = drt_dataset_epoch_len(ds, &len) == want and drt_dataset_set_epoch_len(ds, 5) == want and
                drt_dataset_set_prefetch_bytes(ds, 1 << 20) == want;
            std.posix.exit(if (ok_all) 0 else 1);
        }
        if (held) ds.?.mutex.unlock();
        const result = std.posix.waitpid(pid, 0);
        try t.expect(std.posix.W.IFEXITED(result.status) and std.posix.W.EXITSTATUS(result.status) == 0);
    }

    // A remote: reserved must be 0; in a forked child it and the writer's getters say
    // DRT_E_FORKED (the parent's fetches in flight never finish there).
    const Stub = struct {
        fn open(_: ?*anyopaque, _: [*:0]const u8, _: *u64, _: *?*anyopaque, _: [*]u8, _: u64) callconv(.c) i32 {
            return 1;
        }
        fn read(_: ?*anyopaque, _: ?*anyopaque, _: u64, _: [*]u8, _: u64, _: [*]u8, _: u64) callconv(.c) i32 {
            return 1;
        }
        fn close(_: ?*anyopaque, _: ?*anyopaque) callconv(.c) void {}
    };
    const rdir = try std.fs.path.join(t.allocator, &.{ base, "remote" });
    defer t.allocator.free(rdir);
    var ropts: abi.RemoteOptions = .{ .ops = .{ .context = null, .open = &Stub.open, .read = &Stub.read, .close = &Stub.close }, .cache_dir = abi.Str.from(rdir), .budget_bytes = 1 << 20, .retries = 0, .reserved = 1 };
    var rm: ?*remote.Remote = null;
    try t.expectEqual(invalid, drt_remote_open(&ropts, &rm));
    try t.expectEqualStrings("drt_remote_options.reserved must be 0", status.lastMessage());
    ropts.reserved = 0;
    try t.expectEqual(@as(Rc, 0), drt_remote_open(&ropts, &rm));
    defer drt_remote_close(rm);
    const pid = try std.posix.fork();
    if (pid == 0) {
        var n: u64 = 0;
        // A runtime of the child's own does not make the parent's remote usable.
        var child_rt: ?*Runtime = null;
        const ok_all = drt_remote_set_read_file(rm, null) == forked_rc and drt_remote_set_release(rm, null) == forked_rc and drt_writer_set_schema(w, null, 0) == forked_rc and drt_writer_sample_count(w, &n) == forked_rc and
            drt_runtime_open(1, &child_rt) == 0 and drt_dataset_open_remote(child_rt, &paths, 1, &options, rm, &ds) == forked_rc;
        std.posix.exit(if (ok_all) 0 else 1);
    }
    const result = std.posix.waitpid(pid, 0);
    try t.expect(std.posix.W.IFEXITED(result.status) and std.posix.W.EXITSTATUS(result.status) == 0);
}
