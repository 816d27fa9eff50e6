/* Entry of the 32-bit consumer: the 64-bit harness far-returns here in compatibility mode
 * (CS = COMPAT32_CS) with ESP set and EDI/ESI = main32's arguments; main32's result is the
 * exit status. */
#include "guest_protocol.h"
    .code32
    .section .text.start32, "ax"
    .globl _start32
_start32:
    push %esi
    push %edi
    call main32
    outl %eax, $PORT_EXIT
1:  hlt
    jmp 1b
