/*
 * dlock_log.h: the reference's (UMDK DLock) log macros, for application code that uses them.
 *
 * The reference writes these lines to its own log and to URMA's; there is no URMA here, so
 * they go to standard error, one line each ("dlock <level> <function>:<line>: <message>"),
 * when priority <= the level set by dlock_set_log_level (syslog priorities, LOG_ERR = 3 ...
 * LOG_DEBUG = 7; LOG_WARNING until set). dlock's library does not log through this: it logs
 * through the host's tracing subscriber, and log_level in server_cfg/client_cfg is ignored.
 */

#ifndef __DLOCK_LOG_H__
#define __DLOCK_LOG_H__

#include <syslog.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>

namespace dlock {
constexpr unsigned int DLOCK_LOG_FORMAT_LEN = 512;

/* The level dlock_log prints up to (a syslog priority). Relaxed: a filter, nothing else. */
inline std::atomic<int> dlock_log_level{LOG_WARNING};

inline void dlock_set_log_level(int log_level)
{
    dlock_log_level.store(log_level, std::memory_order_relaxed);
}

__attribute__((format(printf, 4, 5))) inline void dlock_log(const char *func, int line,
                                                             int priority, const char *format,
                                                             ...) noexcept
{
    static const char *const names[] = {"EMERG", "ALERT", "CRIT", "ERR",
                                        "WARNING", "NOTICE", "INFO", "DEBUG"};
    if (priority > dlock_log_level.load(std::memory_order_relaxed)) {
        return;
    }
    char msg[DLOCK_LOG_FORMAT_LEN];
    va_list args;
    va_start(args, format);
    std::vsnprintf(msg, sizeof(msg), format, args);
    va_end(args);
    const char *name = (priority >= 0 && priority <= LOG_DEBUG) ? names[priority] : "?";
    std::fprintf(stderr, "dlock %s %s:%d: %s\n", name, func, line, msg);
}

#define DLOCK_LOG(dbg_level, fmt, ...) \
    dlock::dlock_log(__FUNCTION__, __LINE__, dbg_level, fmt, ##__VA_ARGS__)

#define DLOCK_LOG_DEBUG(format, ...) DLOCK_LOG(LOG_DEBUG, format, ##__VA_ARGS__)
#define DLOCK_LOG_INFO(format, ...) DLOCK_LOG(LOG_INFO, format, ##__VA_ARGS__)
#define DLOCK_LOG_WARN(format, ...) DLOCK_LOG(LOG_WARNING, format, ##__VA_ARGS__)
#define DLOCK_LOG_ERR(format, ...) DLOCK_LOG(LOG_ERR, format, ##__VA_ARGS__)
} /* namespace dlock */

#endif /* __DLOCK_LOG_H__ */
