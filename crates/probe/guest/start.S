/* Probe entry. The VMM starts every vCPU here in 64-bit mode with paging on
 * (identity map), RSP at the vCPU's stack, RDI = vCPU index, RSI = command block. */
#define __ASSEMBLER__ 1
#include "abi.h"
    .section .text.start, "ax"
    .globl _start
    .code64
_start:
    cld
    xor %rbp, %rbp
    call probe_main
1:  cli
    hlt
    jmp 1b

/* Exception stubs: report the vector on the fault port (the VMM ends the VM with an
 * error naming it), then stop. */
/* Stubs report the vector in %al, the faulting RIP in %rbx and CR2 in %rcx (the
 * VMM reads them from the vCPU registers). Vectors 8, 10-14, 17 and 21 push an error
 * code, so their RIP sits one slot higher on the stack. */
    .macro EXC n
    .globl exc_\n
exc_\n:
    .if (\n == 8) || ((\n >= 10) && (\n <= 14)) || (\n == 17) || (\n == 21)
    mov 8(%rsp), %rbx
    .else
    mov (%rsp), %rbx
    .endif
    mov $\n, %al
    jmp exc_common
    .endm
    .text
    EXC 0
    EXC 1
    EXC 2
    EXC 3
    EXC 4
    EXC 5
    EXC 6
    EXC 7
    EXC 8
    EXC 9
    EXC 10
    EXC 11
    EXC 12
    EXC 13
    EXC 14
    EXC 15
    EXC 16
    EXC 17
    EXC 18
    EXC 19
    EXC 20
    EXC 21
exc_common:
    mov %cr2, %rcx
    mov $PORT_PROBE_FAULT, %dx
    outb %al, %dx
2:  cli
    hlt
    jmp 2b

    .globl exc_table
    .section .rodata
    .balign 8
exc_table:
    .quad exc_0, exc_1, exc_2, exc_3, exc_4, exc_5, exc_6, exc_7
    .quad exc_8, exc_9, exc_10, exc_11, exc_12, exc_13, exc_14, exc_15
    .quad exc_16, exc_17, exc_18, exc_19, exc_20, exc_21
