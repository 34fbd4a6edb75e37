/* sf_list: the intrusive doubly-linked lists of connections, streams and waiters: a head
 * pointer, and `prev` and `next` members of the element's own type. Nothing is allocated.
 * Macros, so that any such struct serves; head and e are evaluated more than once (pass
 * plain lvalues). */
#ifndef SF_LIST_H
#define SF_LIST_H

#include <stddef.h>

/* Inserts e at the front of the list at head. */
#define SF_LIST_PUSH(head, e)                                                                  \
    do {                                                                                       \
        (e)->prev = NULL;                                                                      \
        (e)->next = (head);                                                                    \
        if (head)                                                                              \
            (head)->prev = (e);                                                                \
        (head) = (e);                                                                          \
    } while (0)

/* Takes e (in the list at head) out of it. */
#define SF_LIST_UNLINK(head, e)                                                                \
    do {                                                                                       \
        if ((e)->prev)                                                                         \
            (e)->prev->next = (e)->next;                                                       \
        else                                                                                   \
            (head) = (e)->next;                                                                \
        if ((e)->next)                                                                         \
            (e)->next->prev = (e)->prev;                                                       \
        (e)->prev = (e)->next = NULL;                                                          \
    } while (0)

#endif
