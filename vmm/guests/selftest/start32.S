/* Entry of the 32-bit consumer: the 64-bit harness far-returns here in compatibility mode
 * (CS = COMPAT32_CS) with ESP set and EDI/ESI = main32's arguments; main32's result is the
 * exit status. */
    .code32
    .section .text.start32, "ax"
    .globl _start32
_start32:
    push %esi
    push %edi
    call main32
    outl %eax, $0x10        /* exit status port */
1:  hlt
    jmp 1b
