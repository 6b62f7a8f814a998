/* bench/isa_mask.c: an AVX2-only x86 CPU, as every program of a benchmark sees it.
 *
 * Issue 20 measures tilewise against its peers on AVX2-only CPUs. Where the machine at hand
 * has AVX-512, ONEDNN_MAX_CPU_ISA=AVX2 caps oneDNN and ATEN_CPU_CAPABILITY=avx2 caps
 * PyTorch, but ONNX Runtime's MLAS has no such switch, and code dispatched by gcc's
 * target_clones (tilewise's Winograd transforms) picks AVX-512 too. This library makes the
 * CPU itself answer as an AVX2 CPU (an EPYC Rome or Milan core), for every library in the
 * process, whatever its own switches:
 *
 *   cc -shared -fPIC -O2 -Wl,-z,now -o isa_mask.so bench/isa_mask.c
 *   LD_PRELOAD=$PWD/isa_mask.so GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX512F,... program
 *
 * bench/cpu_vs_peers --isa avx2 does this for every program it runs, after checking with
 * the same file built as a program (-DISA_MASK_CHECK) that the mask took.
 *
 * How: Linux's CPUID faulting (arch_prctl ARCH_SET_CPUID, 0) makes each CPUID instruction
 * the process runs raise SIGSEGV. The handler runs the real CPUID with faulting off for a
 * moment, clears the AVX-512, AMX and AVX-VNNI feature bits, and steps over the instruction.
 *
 * When: faulting is switched on from an IFUNC resolver, which ld.so calls while it relocates
 * this library. Preloaded libraries are relocated after the libraries they depend on and just
 * before the main executable, so the executable's own IFUNC resolvers (gcc target_clones)
 * already see the masked bits. Threads started later inherit the setting; execve clears it,
 * and LD_PRELOAD sets it again in the new program.
 *
 * Limits, said where they matter:
 * - XGETBV does not fault: XCR0 still says the AVX-512 registers are enabled. Every library
 *   here checks the CPUID bit as well as XCR0 (oneDNN's Xbyak, MLAS, cpuinfo, OpenBLAS).
 * - glibc picks its string functions in ld.so before anything here runs: GLIBC_TUNABLES with
 *   glibc.cpu.hwcaps=-AVX512F,... covers those.
 * - A SIGSEGV handler the program installs with sigaction() is kept behind ours (sigaction is
 *   interposed) and gets every fault that is not a CPUID. signal() is not interposed.
 * - Needs CPUID faulting (Intel since Ivy Bridge, and KVM guests). Without it the library
 *   says so on stderr and the program runs unmasked, which the check program shows.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <asm/prctl.h>
#include <cpuid.h>
#include <signal.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#ifndef ISA_MASK_CHECK

/* glibc's own sigaction, under the name it also exports: ours below stands in front of it. */
extern int __sigaction(int sig, const struct sigaction *act, struct sigaction *old);

/* Until ld.so has finished relocating this library its calls into libc (through the PLT) go
 * nowhere, so arming and the handler use system calls directly, and the kernel's own
 * sigaction layout with a restorer of our own, as libc would. */
struct ksigaction {
    void *handler;
    unsigned long flags;
    void (*restorer)(void);
    uint64_t mask;
};
#define KSA_RESTORER 0x04000000UL

__attribute__((visibility("hidden"))) void isa_mask_restorer(void);
__asm__(".text\n"
        ".p2align 4\n"
        "isa_mask_restorer:\n"
        "\tmov $15, %eax\n" /* rt_sigreturn */
        "\tsyscall\n");

static long sys4(long n, long a, long b, long c, long d)
{
    long ret;
    register long r10 __asm__("r10") = d;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10)
                     : "rcx", "r11", "memory");
    return ret;
}

static volatile sig_atomic_t armed;
static struct sigaction app_segv; /* what the program asked for SIGSEGV (SIG_DFL at first) */

static long cpuid_faulting(int on)
{
    return sys4(SYS_arch_prctl, ARCH_SET_CPUID, on ? 0L : 1L, 0, 0);
}

static long set_segv(const struct ksigaction *act, struct ksigaction *old)
{
    return sys4(SYS_rt_sigaction, SIGSEGV, (long)act, (long)old, 8);
}

#define BIT(n) (1u << (n))

/* The bits an AVX2-only Zen 2/3 core does not have. */
static void mask(uint32_t leaf, uint32_t sub, uint32_t r[4])
{
    enum { A, B, C, D };
    if (leaf == 7 && sub == 0) {
        /* AVX512 F, DQ, IFMA, PF, ER, CD, BW, VL */
        r[B] &= ~(BIT(16) | BIT(17) | BIT(21) | BIT(26) | BIT(27) | BIT(28) | BIT(30) | BIT(31));
        /* AVX512 VBMI, VBMI2, VNNI, BITALG, VPOPCNTDQ */
        r[C] &= ~(BIT(1) | BIT(6) | BIT(11) | BIT(12) | BIT(14));
        /* AVX512 4VNNIW, 4FMAPS, VP2INTERSECT, FP16; AMX BF16, TILE, INT8 */
        r[D] &= ~(BIT(2) | BIT(3) | BIT(8) | BIT(22) | BIT(23) | BIT(24) | BIT(25));
    } else if (leaf == 7 && sub == 1) {
        /* AVX-VNNI, AVX512 BF16, AMX FP16, AVX-IFMA */
        r[A] &= ~(BIT(4) | BIT(5) | BIT(21) | BIT(23));
        /* AVX-VNNI-INT8, AVX-NE-CONVERT, AMX-COMPLEX, AVX-VNNI-INT16, AVX10 */
        r[D] &= ~(BIT(4) | BIT(5) | BIT(8) | BIT(10) | BIT(19));
    }
}

static void on_segv(int sig, siginfo_t *si, void *ctx)
{
    ucontext_t *uc = ctx;
    greg_t *g = uc->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)g[REG_RIP];
    /* A faulting CPUID is a general-protection fault: si_code SI_KERNEL, RIP on 0F A2. */
    if (si->si_code == SI_KERNEL && ip[0] == 0x0f && ip[1] == 0xa2) {
        uint32_t r[4];
        uint32_t leaf = (uint32_t)g[REG_RAX], sub = (uint32_t)g[REG_RCX];
        cpuid_faulting(0);
        __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
        cpuid_faulting(1);
        mask(leaf, sub, r);
        g[REG_RAX] = r[0];
        g[REG_RBX] = r[1];
        g[REG_RCX] = r[2];
        g[REG_RDX] = r[3];
        g[REG_RIP] += 2;
        return;
    }
    if (app_segv.sa_flags & SA_SIGINFO) {
        app_segv.sa_sigaction(sig, si, ctx);
        return;
    }
    if (app_segv.sa_handler != SIG_DFL && app_segv.sa_handler != SIG_IGN) {
        app_segv.sa_handler(sig);
        return;
    }
    /* Nobody else wants it: the default action, when the instruction runs again. */
    struct ksigaction dfl = {
        .handler = SIG_DFL, .flags = KSA_RESTORER, .restorer = isa_mask_restorer, .mask = 0};
    set_segv(&dfl, NULL);
}

static void arm(void)
{
    if (armed) return;
    struct ksigaction sa = {.handler = (void *)on_segv,
                            .flags = SA_SIGINFO | SA_ONSTACK | KSA_RESTORER,
                            .restorer = isa_mask_restorer,
                            .mask = 0};
    struct ksigaction before;
    if (set_segv(&sa, &before) != 0) return;
    if (cpuid_faulting(1) != 0) {
        static const char msg[] = "isa_mask: this kernel or CPU has no CPUID faulting; "
                                  "the program runs unmasked\n";
        set_segv(&before, NULL);
        sys4(SYS_write, 2, (long)msg, sizeof msg - 1, 0);
        return;
    }
    /* A program started with SIGSEGV ignored keeps that for its non-CPUID faults. */
    app_segv.sa_handler = (__sighandler_t)before.handler;
    armed = 1;
}

int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    if (sig != SIGSEGV || !armed) return __sigaction(sig, act, old);
    if (old) *old = app_segv;
    if (act) app_segv = *act;
    return 0;
}

/* The IFUNC that arms the mask during relocation; its address is kept in data, so that ld.so
 * has an IRELATIVE relocation to resolve. The constructor is a second chance. */
static void armed_marker(void)
{
}
static void (*resolve_armed(void))(void)
{
    arm();
    return armed_marker;
}
__attribute__((visibility("hidden"))) void isa_mask_armed(void)
    __attribute__((ifunc("resolve_armed")));
void (*volatile isa_mask_keep)(void) = isa_mask_armed;

__attribute__((constructor)) static void arm_late(void)
{
    arm();
}

#else /* ISA_MASK_CHECK: a plain program, to be run with the library preloaded */
#include <setjmp.h>
#include <stdio.h>

static sigjmp_buf back;
static volatile sig_atomic_t own_handler_ran;

static void own_segv(int sig, siginfo_t *si, void *ctx)
{
    (void)sig;
    (void)si;
    (void)ctx;
    if (own_handler_ran) _exit(1); /* a CPUID reached it: the mask's handler is gone */
    own_handler_ran = 1;
    siglongjmp(back, 1);
}

static unsigned avx512f_bit(void)
{
    uint32_t a, b, c, d;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 16) & 1;
}

/* What a program started under the mask sees, by CPUID and by gcc's dispatch (whose IFUNC
 * resolvers and constructor ran during start-up); then that a SIGSEGV handler of its own still
 * gets its own faults, and that CPUID stays masked after it is installed. Prints one line.
 * Exit status: 0 all as expected, 1 not, 77 this machine cannot show it (no CPUID faulting,
 * or no AVX2). */
int main(void)
{
    unsigned masked = avx512f_bit();
    int gcc512 = __builtin_cpu_supports("avx512f") != 0, gcc2 = __builtin_cpu_supports("avx2") != 0;
    /* ARCH_GET_CPUID: 0 while CPUID faults, that is while the mask is armed */
    long faulting = syscall(SYS_arch_prctl, ARCH_GET_CPUID, 0) == 0;

    struct sigaction sa = {0};
    sa.sa_sigaction = own_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);
    if (sigsetjmp(back, 1) == 0) {
        volatile int *nowhere = NULL;
        *nowhere = 1;
    }
    unsigned still = avx512f_bit();
    printf("cpuid_avx512f=%u gcc_avx512f=%d gcc_avx2=%d own_segv_handler=%d "
           "after_it_cpuid_avx512f=%u\n",
           masked, gcc512, gcc2, (int)own_handler_ran, still);
    if (!faulting || !gcc2) return 77;
    return masked == 0 && gcc512 == 0 && own_handler_ran && still == 0 ? 0 : 1;
}
#endif
