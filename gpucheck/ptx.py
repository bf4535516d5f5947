"""The kernel, as PTX text for cuModuleLoadData (the driver's JIT compiles it; a NUL-terminated string).

Every thread runs `iterations` dependent FMAs and stores its result (so nothing can be optimized away); thread 0 of
block 0 also stores %globaltimer (PTX ISA 3.1+, sm_30+: a 64-bit nanosecond timer) before and after.
Output buffer: [0] start ns (u64), [8] end ns (u64), [16 + 4*i] thread i's result (f32)."""

from __future__ import annotations

KERNEL_NAME = "gpufrac_spin"
PTX_TEMPLATE = """//
// gpufrac gpu_check: spin for a number of dependent FMA iterations.
//
.version {isa}
.target {target}
.address_size 64

.visible .entry gpufrac_spin(
	.param .u64 gpufrac_spin_out,
	.param .u64 gpufrac_spin_iterations
)
{{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<4>;
	.reg .f32 	%f<2>;
	.reg .b64 	%rd<9>;

	ld.param.u64 	%rd1, [gpufrac_spin_out];
	ld.param.u64 	%rd2, [gpufrac_spin_iterations];
	cvta.to.global.u64 	%rd3, %rd1;
	mov.u64 	%rd4, %globaltimer;
	mov.f32 	%f1, 0f3F800000;
	mov.u64 	%rd5, 0;
	setp.eq.u64 	%p1, %rd2, 0;
	@%p1 bra 	$L_done;
$L_loop:
	fma.rn.f32 	%f1, %f1, 0f3F7FFFEF, 0f3A83126F;
	add.u64 	%rd5, %rd5, 1;
	setp.lt.u64 	%p1, %rd5, %rd2;
	@%p1 bra 	$L_loop;
$L_done:
	mov.u64 	%rd6, %globaltimer;
	mov.u32 	%r1, %tid.x;
	mov.u32 	%r2, %ctaid.x;
	mov.u32 	%r3, %ntid.x;
	mad.lo.u32 	%r3, %r2, %r3, %r1;
	mul.wide.u32 	%rd7, %r3, 4;
	add.u64 	%rd8, %rd3, %rd7;
	st.global.f32 	[%rd8+16], %f1;
	or.b32 	%r1, %r1, %r2;
	setp.ne.u32 	%p2, %r1, 0;
	@%p2 bra 	$L_end;
	st.global.u64 	[%rd3], %rd4;
	st.global.u64 	[%rd3+8], %rd6;
$L_end:
	ret;
}}
"""

# The lowest PTX ISA version each target accepts (PTX ISA "Release notes" table). The device's own target is
# tried first, then sm_75 (the oldest CUDA 13 still targets) and sm_50; the JIT runs PTX on any newer GPU.
PTX_MIN_ISA = {
    "sm_50": "4.0", "sm_52": "4.1", "sm_53": "4.2", "sm_60": "5.0", "sm_61": "5.0", "sm_62": "5.0",
    "sm_70": "6.0", "sm_72": "6.1", "sm_75": "6.3", "sm_80": "7.0", "sm_86": "7.1", "sm_87": "7.4",
    "sm_89": "7.8", "sm_90": "7.8", "sm_100": "8.6", "sm_101": "8.6", "sm_103": "8.8", "sm_120": "8.7",
    "sm_121": "8.8",
}


def ptx_source(target: str, isa: str) -> str:
    return PTX_TEMPLATE.format(target=target, isa=isa)


def ptx_candidates(cc_major: int, cc_minor: int) -> list[tuple[str, str]]:
    own = f"sm_{cc_major}{cc_minor}"
    candidates = [(own, PTX_MIN_ISA[own])] if own in PTX_MIN_ISA else []
    for target in ("sm_75", "sm_50"):
        if (target, PTX_MIN_ISA[target]) not in candidates:
            candidates.append((target, PTX_MIN_ISA[target]))
    return candidates
