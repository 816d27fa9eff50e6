/* Entry point: the VMM enters in 64-bit mode at CPL0 with RSP set and RDI = the case number. */
#include "guest_protocol.h"
    .section .text.start, "ax"
    .globl _start
_start:
    call main
    outl %eax, $PORT_EXIT
1:  hlt
    jmp 1b
