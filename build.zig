//! Builds libdataset_rt (static and shared, C ABI), installs the header and a pkg-config
//! file, and runs the Zig unit tests (`zig build test`).
//!
//! The toolchain is pinned: the PyPI package `ziglang==0.15.2` is the only supported
//! compiler, and the build refuses any other version rather than miscompile against a
//! changed standard library.

const std = @import("std");
const builtin = @import("builtin");

const required_zig = std.SemanticVersion{ .major = 0, .minor = 15, .patch = 2 };
const lib_version = std.SemanticVersion{ .major = 0, .minor = 1, .patch = 0 };

comptime {
    if (builtin.zig_version.order(required_zig) != .eq) {
        @compileError("dataset_rt requires Zig 0.15.2 (pip install ziglang==0.15.2; run `python -m ziglang build`)");
    }
}

pub fn build(b: *std.Build) void {
    // Baseline CPU unless told otherwise (-Dcpu=native for a tuned local build): the
    // library must run on any x86-64 and under valgrind.
    const target = b.standardTargetOptions(.{ .default_target = .{ .cpu_model = .baseline } });
    // ReleaseSafe unless asked otherwise: the shipped library keeps safety checks.
    const optimize = b.option(std.builtin.OptimizeMode, "optimize", "Optimization mode (default ReleaseSafe)") orelse .ReleaseSafe;
    // Release wheels strip debug info (the library shrinks several times); a checkout's
    // build keeps it for debuggers and valgrind.
    const strip = b.option(bool, "strip", "Strip debug info from the libraries (default: keep it, except in ReleaseSmall)");
    // A wheel cannot hold symlinks, so the library it ships is one file whose soname is
    // its own name (libdataset_rt.so); a C program linked against it then finds it by
    // rpath. A system install keeps the versioned soname and its symlinks.
    const versioned_soname = b.option(bool, "versioned-soname", "Shared library soname libdataset_rt.so.0 with symlinks (default true)") orelse true;

    const version_text = b.allocator.dupeZ(u8, b.fmt("{d}.{d}.{d}", .{ lib_version.major, lib_version.minor, lib_version.patch })) catch @panic("OOM");
    const options = b.addOptions();
    options.addOption([:0]const u8, "version", version_text);

    const root = b.createModule(.{
        .root_source_file = b.path("native/src/root.zig"),
        .target = target,
        .optimize = optimize,
        .link_libc = true,
        .strip = strip,
        // Position-independent in the static library too: Zig builds musl targets'
        // archives without it, and PIE executables (the default of Alpine's and Debian's
        // compilers) cannot link absolute relocations.
        .pic = true,
    });
    root.addOptions("build_options", options);

    // The code is compiled once, into one object that both libraries link: the shared
    // library's soname is no input of that compile, so a build that differs only in it
    // (a system install after the Python package's build) reuses the cached object.
    const object = b.addObject(.{ .name = "dataset_rt", .root_module = root });
    const static_lib = b.addLibrary(.{ .name = "dataset_rt", .linkage = .static, .root_module = linkModule(b, target, optimize, strip, object) });
    // GCC and Clang (and so Rust's and Go's linkers) do not provide Zig's compiler_rt
    // symbols (e.g. __zig_probe_stack): ship them inside the archive.
    static_lib.bundle_compiler_rt = true;
    const shared_lib = b.addLibrary(.{
        .name = "dataset_rt",
        .linkage = .dynamic,
        .root_module = linkModule(b, target, optimize, strip, object),
        .version = if (versioned_soname) lib_version else null,
    });
    shared_lib.installHeader(b.path("native/include/dataset_rt.h"), "dataset_rt.h");
    b.installArtifact(static_lib);
    b.installArtifact(shared_lib);

    // pkg-config file so C, C++, Rust and Go builds can find the installed library.
    const pc = b.addWriteFiles();
    const pc_file = pc.add("dataset_rt.pc", b.fmt(
        \\prefix={s}
        \\libdir=${{prefix}}/lib
        \\includedir=${{prefix}}/include
        \\
        \\Name: dataset_rt
        \\Description: Dataset cache for ML training (C ABI of the Zig core)
        \\Version: {d}.{d}.{d}
        \\Libs: -L${{libdir}} -ldataset_rt
        \\Libs.private: -lc
        \\Cflags: -I${{includedir}}
        \\
    , .{ absolutePrefix(b), lib_version.major, lib_version.minor, lib_version.patch }));
    b.getInstallStep().dependOn(&b.addInstallFileWithDir(pc_file, .lib, "pkgconfig/dataset_rt.pc").step);

    const test_module = b.createModule(.{
        .root_source_file = b.path("native/src/root.zig"),
        .target = target,
        .optimize = optimize,
        .link_libc = true,
    });
    test_module.addIncludePath(b.path("native/include"));
    // The test module's build_options add `fixtures_dir`: the reference caches written by
    // dataset-rt 0.4.8, as an absolute path so tests find them whatever the cwd. The
    // library's build_options do not have it, so only test code may name it.
    const test_options = b.addOptions();
    test_options.addOption([:0]const u8, "version", version_text);
    test_options.addOption([]const u8, "fixtures_dir", b.pathFromRoot("tests/fixtures/dataset-rt-0.4.8"));
    test_module.addOptions("build_options", test_options);
    // LLVM, as for the shipped library, also in Debug (whose default is Zig's own x86-64
    // backend): it compiles the SHA-NI block function for a baseline CPU, so the tests hash
    // with it where the CPU has it (the portable one has tests of its own), and the tests
    // run in about half the time.
    const unit_tests = b.addTest(.{ .root_module = test_module, .use_llvm = true });
    const run_tests = b.addRunArtifact(unit_tests);
    b.step("test", "Run the Zig unit tests").dependOn(&run_tests.step);
}

/// A module with no code of its own that links `object` (see `build`).
fn linkModule(b: *std.Build, target: std.Build.ResolvedTarget, optimize: std.builtin.OptimizeMode, strip: ?bool, object: *std.Build.Step.Compile) *std.Build.Module {
    const module = b.createModule(.{ .target = target, .optimize = optimize, .link_libc = true, .strip = strip, .pic = true });
    module.addObject(object);
    return module;
}

/// The install prefix as an absolute path (a relative --prefix would make the .pc file
/// usable only from the build directory).
fn absolutePrefix(b: *std.Build) []const u8 {
    if (std.fs.path.isAbsolute(b.install_prefix)) return b.install_prefix;
    const cwd = std.process.getCwdAlloc(b.allocator) catch @panic("OOM");
    return std.fs.path.resolve(b.allocator, &.{ cwd, b.install_prefix }) catch @panic("OOM");
}
