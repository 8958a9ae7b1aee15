#include "textflag.h"
#include "go_asm.h"

#define SYS_prctl	157
#define PR_CAPBSET_DROP	24
#define EINVAL	22
#define EPERM	1

// _fence_sandbox_rt0 is the in-sandbox binary's entry point on
// linux/amd64 when it is linked with -E _fence_sandbox_rt0 (see
// scripts/build.sh). Started as an init (argv[1] is "init"), the process
// still has a single thread here, before the Go runtime starts any: it
// drops from its bounding set every capability not in boundingKeep, and
// every thread the runtime starts later is cloned with that set. The
// init's own drops (nsinit) then find nothing left to drop, where each
// would otherwise stop and signal every thread of the runtime. Any other
// start, and any failure, goes on unchanged: the init reads its bounding
// set and drops what remains itself.
TEXT _fence_sandbox_rt0(SB),NOSPLIT|NOFRAME,$0
	MOVQ	0(SP), AX	// argc
	CMPQ	AX, $2
	JLT	start
	MOVQ	16(SP), SI	// argv[1]
	CMPL	0(SI), $0x74696e69	// "init", little-endian
	JNE	start
	CMPB	4(SI), $0
	JNE	start
	MOVQ	$const_boundingKeep, R12
	XORQ	R13, R13	// the capability
drop:
	BTQ	R13, R12
	JCS	next
	MOVQ	$SYS_prctl, AX
	MOVQ	$PR_CAPBSET_DROP, DI
	MOVQ	R13, SI
	XORQ	DX, DX
	XORQ	R10, R10
	XORQ	R8, R8
	SYSCALL
	CMPQ	AX, $-EINVAL	// past the kernel's last capability
	JEQ	start
	CMPQ	AX, $-EPERM	// no CAP_SETPCAP: nothing to drop here
	JEQ	start
next:
	INCQ	R13
	CMPQ	R13, $64
	JLT	drop
start:
	// The stack and registers are as the kernel left them.
	JMP	_rt0_amd64_linux(SB)
