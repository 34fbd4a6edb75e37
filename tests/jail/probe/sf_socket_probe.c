/* sf-socket-probe FAMILY [TYPE] [PROTO] [int80]: a tiny static program, no libc, that
 * the tests copy into a sandbox to ask its kernel (through its seccomp filter) for a
 * socket of that family. Prints "ok" or "errno N" and exits 0 / 1. With "int80" the
 * call goes through the 32-bit system call entry (socketcall), which a filter must
 * cover too. x86_64 only. */
typedef unsigned long ul;

static long sys3(long n, long a, long b, long c)
{
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}

static long int80(long n, long a, long b, long c)
{
    long r;
    __asm__ volatile("int $0x80" : "=a"(r) : "a"(n), "b"(a), "c"(b), "d"(c) : "memory");
    return r;
}

static long num(const char *s)
{
    long v = 0;
    while (*s >= '0' && *s <= '9')
        v = v * 10 + (*s++ - '0');
    return v;
}

static void out(const char *s)
{
    ul n = 0;
    while (s[n])
        n++;
    sys3(1 /* write */, 1, (long)s, (long)n);
}

static void put_num(long v)
{
    char b[24];
    int i = 23;
    b[i] = 0;
    do
        b[--i] = (char)('0' + v % 10);
    while ((v /= 10) > 0);
    out(b + i);
}

static int streq(const char *a, const char *b)
{
    while (*a && *a == *b)
        a++, b++;
    return *a == *b;
}

void start_c(long *sp)
{
    long argc = sp[0];
    char **argv = (char **)(sp + 1);
    long fam = argc > 1 ? num(argv[1]) : 0, type = argc > 2 ? num(argv[2]) : 2 /* DGRAM */;
    long proto = argc > 3 ? num(argv[3]) : 0, r;

    if (argc > 4 && streq(argv[4], "int80")) {
        r = int80(359, fam, type, proto); /* i386 socket() */
    } else {
        r = sys3(41 /* socket */, fam, type, proto);
    }
    if (r >= 0) {
        out("ok\n");
        sys3(60, 0, 0, 0);
    }
    out("errno ");
    put_num(-r);
    out("\n");
    sys3(60 /* exit */, 1, 0, 0);
}

__asm__(".globl _start\n_start:\n mov %rsp, %rdi\n and $-16, %rsp\n call start_c\n hlt\n");
