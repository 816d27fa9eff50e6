/* Entry point: the VMM enters in 64-bit mode at CPL0 with RSP set and RDI = the case number. */
    .section .text.start, "ax"
    .globl _start
_start:
    call main
    outl %eax, $0x10        /* exit status port */
1:  hlt
    jmp 1b
